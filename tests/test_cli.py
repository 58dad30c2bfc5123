"""The CLI: dispatch table vs --help, config precedence, recipe files, and bad input as one-line errors."""

import re

import pytest

from redline import cli
from redline.config import TrainConfig, parse
from redline.errors import UserError
from tests.test_train import dataset  # noqa: F401  (a pytest fixture)


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_dispatch_table_matches_help(capsys):
    code, out, _ = run_cli(["--help"], capsys)
    assert code == 0
    listed = re.findall(r"^  (\S+)\s{2,}", out, flags=re.M)
    assert listed == list(cli.COMMANDS)
    for name, (module, _) in cli.COMMANDS.items():  # every entry points at a module with main()
        mod = __import__(f"redline.commands.{module}", fromlist=["main"])
        assert callable(mod.main), name


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_every_command_has_help(name, capsys):
    code, out, err = run_cli([name, "--help"], capsys)
    assert code == 0, err
    assert "usage" in (out + err).lower()


def test_unknown_command_suggests(capsys):
    code, _, err = run_cli(["trian"], capsys)
    assert code == 2
    assert "did you mean `redline train`" in err


def test_train_help_lists_every_field_with_default(capsys):
    code, out, _ = run_cli(["train", "--help"], capsys)
    assert code == 0
    text = re.sub(r"\s+", " ", out)
    for flag in ["--max-steps", "--model.n-kv-head", "--model.qk-norm", "--optim.lr", "--data.path", "--seq-len"]:
        assert flag in text, flag
    assert "Number of key/value heads" in text


def test_precedence_defaults_preset_recipe_cli(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('preset = "gpt2-124m"\nmax_steps = 7\n[optim]\nlr = 0.002\nname = "muon"\n')
    cfg = parse(TrainConfig, ["--config", str(recipe), "optim.lr=5e-4", "--model.n-layer", "3"],
                prog="t", description="t")
    assert cfg.preset == "gpt2-124m" and cfg.model.pos_emb == "learned"  # from the preset
    assert cfg.max_steps == 7 and cfg.optim.name == "muon"  # from the recipe
    assert cfg.optim.lr == 5e-4 and cfg.model.n_layer == 3  # the command line wins


def test_yaml_recipe(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model:\n  n_kv_head: 1\nbatch_size: 4\n")
    cfg = parse(TrainConfig, ["--config", str(recipe)], prog="t", description="t")
    assert cfg.model.n_kv_head == 1 and cfg.batch_size == 4


def test_unknown_recipe_key_suggests(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text("[optim]\nlearning_rat = 1.0\n[model]\nn_layers = 3\n")
    with pytest.raises(UserError, match="unknown config key 'optim.learning_rat'"):
        parse(TrainConfig, ["--config", str(recipe)], prog="t", description="t")
    recipe.write_text("[model]\nn_layers = 3\n")
    with pytest.raises(UserError, match="did you mean model.n_layer"):
        parse(TrainConfig, ["--config", str(recipe)], prog="t", description="t")


def test_recipe_type_errors(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('[model]\nmlp = "swiglo"\n')
    with pytest.raises(UserError, match="did you mean 'swiglu'"):
        parse(TrainConfig, ["--config", str(recipe)], prog="t", description="t")
    recipe.write_text('max_steps = "ten"\n')
    with pytest.raises(UserError, match="must be a int"):
        parse(TrainConfig, ["--config", str(recipe)], prog="t", description="t")


@pytest.mark.parametrize("name,content,fragment", [
    ("r.toml", "max_steps = 5\n# caf\xe9 in Latin-1\n".encode("latin-1"), "is not UTF-8 text (byte 19"),
    ("r.yaml", b"model:\n  n_layer: [1, 2\nbatch_size: 4\n", "cannot parse recipe"),
    ("r.yaml", b"- 1\n- 2\n", "the top level must be a table of settings, not a list"),
    ("r.toml", b"max_steps = \n", "cannot parse recipe"),
])
def test_unreadable_recipe_is_one_line(tmp_path, capsys, name, content, fragment):
    recipe = tmp_path / name
    recipe.write_bytes(content)
    with pytest.raises(UserError, match=re.escape(fragment)) as e:
        parse(TrainConfig, ["--config", str(recipe)], prog="t", description="t")
    assert "\n" not in str(e.value)
    code, _, err = run_cli(["train", "--config", str(recipe), "max_steps=1"], capsys)
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err


def test_sweep_recipe_and_claims_file_errors_are_one_line(tmp_path):
    from redline.experiments.claims import load_claims
    from redline.experiments.recipes import load_recipe

    (tmp_path / "s.yaml").write_bytes(b"name: x\nruns: [a,\n  b\n")
    with pytest.raises(UserError, match=r"cannot parse recipe .*\(line \d+, column \d+\)$") as e:
        load_recipe(str(tmp_path / "s.yaml"))
    assert "\n" not in str(e.value)
    (tmp_path / "s.toml").write_bytes(b"name = '\xff'\n")
    with pytest.raises(UserError, match="is not UTF-8 text"):
        load_recipe(str(tmp_path / "s.toml"))
    (tmp_path / "c.toml").write_bytes(b"[[claim]]\nid = '\xe9'\n")
    with pytest.raises(UserError, match="claims file .* is not UTF-8 text"):
        load_claims(tmp_path / "c.toml")


def test_unknown_preset_suggests():
    with pytest.raises(UserError, match="did you mean modern-124m"):
        parse(TrainConfig, ["--preset", "modern-124"], prog="t", description="t")


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["model.n_head=5"], "does not divide model.n_embd"),
        (["model.n_kv_head=4"], "does not divide model.n_head"),
        (["seq_len=4096"], "longer than model.context_len"),
        (["batch_size=0"], "batch_size must be positive"),
    ],
)
def test_invalid_values_exit_2_with_one_line(argv, fragment, capsys):
    code, _, err = run_cli(["train", *argv], capsys)
    assert code == 2
    assert fragment in err
    assert len(err.strip().splitlines()) == 1


def test_unknown_cli_flag_exits_nonzero(capsys):
    code, out, err = run_cli(["train", "--max-stepz", "3"], capsys)
    assert code == 2
    assert "max-steps" in out + err  # tyro's "perhaps you meant"


def test_cuda_on_cpu_machine_is_a_clear_error(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code, _, err = run_cli(["train", "device=cuda", "max_steps=1"], capsys)
    assert code == 2
    assert "no CUDA GPU" in err


def test_overrides_take_true_and_false_as_json_and_yaml_spell_them():
    cfg = parse(TrainConfig, ["tensorboard=false", "lora.enabled=true", "init_from=somewhere", "--compile=false"],
                prog="redline train", description="")
    assert (cfg.tensorboard, cfg.lora.enabled, cfg.compile) == (False, True, False)


def test_bad_outputs_and_values_are_one_line_before_any_work(tmp_path, capsys):
    (tmp_path / "file.txt").write_text("x")
    for argv, fragment in [
        (["eval", "--checkpoint", "nowhere", "--batches", "0"], "--batches must be >= 1"),
        (["sample", "--checkpoint", "nowhere", "--top-k", "-1"], "--top-k must be >= 0"),
        (["generate", "--checkpoint", "nowhere", "--prompt", "x", "--jsonl", str(tmp_path)], "is a folder"),
        (["generate", "--checkpoint", "nowhere", "--prompt", "x", "--jsonl", str(tmp_path / "no" / "x.jsonl")],
         "does not exist"),
        (["bench", "--preset", "tiny", "--json-out", str(tmp_path)], "is a folder"),
        (["dashboard", str(tmp_path / "file.txt")], "is not a folder"),
        (["dashboard", str(tmp_path), "--port", "99999"], "--port must be 0-65535"),
        (["report", str(tmp_path / "file.txt")], "is a file"),
    ]:
        code, _, err = run_cli(argv, capsys)
        assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, (argv, err)


def test_a_new_run_refuses_a_run_name_that_holds_a_run(dataset, tmp_path, capsys):  # noqa: F811
    from tests.test_sft import _pretrain

    pre = _pretrain(dataset, tmp_path)
    code, _, err = run_cli(["train", f"data.path={dataset}", f"out_dir={tmp_path}", "run_name=pre", "max_steps=1",
                            "model.n_layer=1", "model.n_embd=32", "model.n_head=2", "batch_size=2", "seq_len=32"],
                           capsys)
    assert code == 2 and "already holds a run; continue it with `redline train --resume" in err
    assert [p.name for p in (pre / "checkpoints").iterdir()] == ["step_00000002"]  # untouched


def test_outputs_of_the_wrong_kind_are_refused_before_any_work(tmp_path, capsys):
    (tmp_path / "file.txt").write_text("x")
    for argv, fragment in [
        (["export", "nowhere", "--out", str(tmp_path / "model.gguf")], "add --format gguf"),
        (["sweep", "smoke", "--out", str(tmp_path / "file.txt")], "is a file"),
        (["tokenizer", "train", "--inputs", str(tmp_path / "file.txt"), "--out", str(tmp_path / "file.txt")],
         "is a file"),
    ]:
        code, _, err = run_cli(argv, capsys)
        assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, (argv, err)


def test_a_sweep_folder_of_another_recipe_is_refused(tmp_path, capsys):
    import json

    (tmp_path / "sw").mkdir()
    (tmp_path / "sw" / "sweep.json").write_text(json.dumps({"recipe": {"name": "mine"}, "runs": []}))
    code, _, err = run_cli(["sweep", "smoke", "--out", str(tmp_path / "sw"), "--dry-run"], capsys)
    assert code == 2 and "holds the sweep of recipe 'mine', not 'smoke'" in err


def test_a_variant_typo_and_an_unknown_claim_key_are_named(tmp_path, capsys):
    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "r"\npresets = ["tiny"]\nbudget = { max_steps = 2 }\n[[variants]]\nname = "a"\n'
                      '[[variants]]\nname = "b"\nset = { "model.n_kv_hed" = 1 }\n')
    code, _, err = run_cli(["sweep", str(recipe), "--dry-run", "--out", str(tmp_path / "sw")], capsys)
    assert code == 2 and "variant b" in err and "n_kv_hed" in err
    claims = tmp_path / "c.toml"
    claims.write_text('[[claim]]\nid = "x"\ntext = "t"\nmetric = "perplexity"\nname = "oops"\n')
    from redline.experiments.claims import load_claims

    with pytest.raises(UserError, match="unknown key 'name'"):
        load_claims(str(claims))


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_sweep_refuses_a_missing_data_path_before_any_run(tmp_path, capsys, dry_run):
    missing = tmp_path / "no_such_corpus"
    argv = ["sweep", "smoke", "--out", str(tmp_path / "sw"), "--data", str(missing)] + ["--dry-run"] * dry_run
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and f"data path {missing} does not exist" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "sw").exists()
