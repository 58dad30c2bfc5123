"""Model: shapes for every toggle, attention against an fp64 reference, GQA/MHA equivalence, counts, compile."""

import math
from dataclasses import replace

import pytest
import torch

from redline.errors import UserError
from redline.model import GPT, ModelConfig, apply_rope, rope_tables
from redline.presets import PRESETS, get_preset

SMALL = ModelConfig(vocab_size=101, context_len=32, n_layer=2, n_embd=32, n_head=4, n_kv_head=2)


def small(**kw) -> ModelConfig:
    return replace(SMALL, **kw)


TOGGLES = dict(
    n_kv_head=[None, 2, 1],
    qk_norm=[False, True],
    fused_qkv=[False, True],
    fused_mlp=[False, True],
    pos_emb=["rope", "learned", "alibi", "none"],
    mlp=["gelu", "swiglu", "geglu", "relu2"],
    norm=["rmsnorm", "layernorm"],
    norm_position=["pre", "post", "output", "sandwich"],
    norm_unit_offset=[True],
    embed_scale=[True],
    norm_affine=[False],
    embed_norm=[True],
    attn_scale=[0.2],
    tie_embeddings=[False, True],
    bias=[False, True],
    sliding_window=[0, 5],
    attn_sinks=[True],
)


def one_at_a_time():
    for name, values in TOGGLES.items():
        for value in values:
            yield pytest.param({name: value}, id=f"{name}={value}")


@pytest.mark.parametrize("overrides", list(one_at_a_time()))
def test_shapes_and_backward_for_every_toggle(overrides):
    torch.manual_seed(0)
    model = GPT(small(**overrides))
    idx = torch.randint(0, 101, (3, 17))
    logits = model(idx)
    assert logits.shape == (3, 17, 101)  # padding (101 -> 128) is cut off
    loss = model(idx, idx)
    assert loss.shape == () and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_all_toggles_combined():
    cfg = small(n_kv_head=1, qk_norm=True, fused_qkv=False, pos_emb="learned", mlp="relu2", norm="layernorm",
                norm_position="post", tie_embeddings=True, bias=True, sliding_window=4, dropout=0.1)
    model = GPT(cfg)
    assert model(torch.randint(0, 101, (2, 9))).shape == (2, 9, 101)


def test_separate_swiglu_mlp_equals_fused_with_the_same_weights():
    torch.manual_seed(0)
    fused, separate = GPT(small(fused_mlp=True)), GPT(small(fused_mlp=False))
    assert sum(p.numel() for p in fused.parameters()) == sum(p.numel() for p in separate.parameters())
    state = fused.state_dict()
    for i, block in enumerate(separate.blocks):  # the fused fc is [gate; up]
        gate, up = state.pop(f"blocks.{i}.mlp.fc.weight").chunk(2)
        state[f"blocks.{i}.mlp.fc.weight"], state[f"blocks.{i}.mlp.up.weight"] = gate, up
    separate.load_state_dict(state)
    idx = torch.randint(0, 101, (2, 11))
    torch.testing.assert_close(separate(idx), fused(idx))


def test_vocab_padding_and_initial_loss():
    model = GPT(small())
    assert model.lm_head.weight.shape[0] == 128 and model.cfg.padded_vocab == 128
    idx = torch.randint(0, 101, (4, 32))
    # at initialisation the loss is close to ln(padded vocab): nothing is learned yet
    assert abs(model(idx, idx).item() - math.log(128)) < 0.3


def reference_attention(model: GPT, x: torch.Tensor) -> torch.Tensor:
    """Attention of block 0 written out in float64: explicit scores, causal (and window) mask, softmax."""
    attn, cfg = model.blocks[0].attn, model.cfg
    B, T, C = x.shape
    H, KV, D = cfg.n_head, cfg.kv_heads, cfg.head_dim
    w = attn.qkv.weight.double()
    q, k, v = (x.double() @ w.T).split([H * D, KV * D, KV * D], dim=-1)
    q = q.view(B, T, H, D).transpose(1, 2)
    k = k.view(B, T, KV, D).transpose(1, 2)
    v = v.view(B, T, KV, D).transpose(1, 2)
    if cfg.qk_norm:
        q = q / torch.sqrt(q.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * attn.q_norm.weight.double()
        k = k / torch.sqrt(k.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * attn.k_norm.weight.double()
    if cfg.pos_emb == "rope":
        cos, sin = rope_tables(cfg, T)
        q, k = apply_rope(q, cos.double(), sin.double()), apply_rope(k, cos.double(), sin.double())
    k = k.repeat_interleave(H // KV, dim=1)
    v = v.repeat_interleave(H // KV, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    i = torch.arange(T)
    if cfg.pos_emb == "alibi":  # Press et al.'s slopes for 6 heads: 4's (2^-2, 2^-4, 2^-6, 2^-8), then 8's odd ones
        assert H == 6
        slopes = torch.tensor([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3], dtype=torch.float64)
        scores = scores - slopes[:, None, None] * (i[:, None] - i[None, :])
    allowed = i[:, None] >= i[None, :]
    if cfg.sliding_window:
        allowed &= (i[:, None] - i[None, :]) < cfg.sliding_window
    scores = scores.masked_fill(~allowed, float("-inf"))
    y = scores.softmax(-1) @ v
    y = y.transpose(1, 2).reshape(B, T, H * D)
    return y @ attn.proj.weight.double().T


@pytest.mark.parametrize("kv,qk_norm,window,alibi", [(4, False, 0, False), (2, True, 0, False), (1, True, 0, False),
                                                     (2, False, 6, False), (6, False, 0, True), (3, True, 6, True)])
def test_attention_matches_fp64_reference(kv, qk_norm, window, alibi):
    torch.manual_seed(1)
    heads = dict(n_head=6, n_embd=48, pos_emb="alibi") if alibi else {}
    model = GPT(small(n_kv_head=kv, qk_norm=qk_norm, sliding_window=window, **heads)).double()
    for p in model.parameters():  # non-trivial norm gains
        if p.dim() == 1:
            torch.nn.init.uniform_(p, 0.5, 1.5)
    x = torch.randn(2, 20, model.cfg.n_embd, dtype=torch.float64)
    _, rope = model.embed(torch.zeros(2, 20, dtype=torch.long))
    mask = model.attention_mask(20, x.device) if alibi else model.sliding_mask(20, x.device)
    ours = model.blocks[0].attn(x, rope and tuple(t.double() for t in rope), mask)
    ref = reference_attention(model, x)
    assert torch.allclose(ours, ref, atol=1e-10, rtol=1e-8)


def test_gqa_with_all_kv_heads_is_mha():
    """n_kv_head == n_head takes the plain multi-head path and equals the default (None) model bit for bit."""
    torch.manual_seed(0)
    a = GPT(small(n_kv_head=None))
    torch.manual_seed(0)
    b = GPT(small(n_kv_head=4))
    idx = torch.randint(0, 101, (2, 12))
    assert torch.equal(a(idx), b(idx))


def test_gqa_equals_mha_with_repeated_kv_weights():
    """A GQA model computes what an MHA model computes when its k/v weights are the GQA ones repeated."""
    torch.manual_seed(0)
    gqa = GPT(small(n_kv_head=2, fused_qkv=False))
    mha = GPT(small(n_kv_head=4, fused_qkv=False))
    state = gqa.state_dict()
    D, rep = 8, 2
    for key in list(state):
        if key.endswith("attn.k.weight") or key.endswith("attn.v.weight"):
            w = state[key].view(2, D, 32)  # (KV, D, C)
            state[key] = w.repeat_interleave(rep, dim=0).reshape(4 * D, 32)
    mha.load_state_dict(state)
    idx = torch.randint(0, 101, (2, 12))
    assert torch.allclose(gqa(idx), mha(idx), atol=1e-5)


def test_forced_backend_equals_auto():
    torch.manual_seed(0)
    auto = GPT(small(n_kv_head=2))
    forced = GPT(small(n_kv_head=2, attn_backend="math"))
    forced.load_state_dict(auto.state_dict())
    idx = torch.randint(0, 101, (2, 12))
    assert torch.allclose(auto(idx), forced(idx), atol=1e-5)


def expected_params(cfg: ModelConfig) -> int:
    """Parameter count written out from the architecture."""
    C, V, H, KV, D, F_ = cfg.n_embd, cfg.padded_vocab, cfg.n_head, cfg.kv_heads, cfg.head_dim, cfg.hidden_dim
    norm = C * (2 if cfg.norm == "layernorm" and cfg.bias else 1)
    attn = C * (H + 2 * KV) * D + H * D * C + (((H + 2 * KV) * D + C) if cfg.bias else 0)
    qk = (H + KV if cfg.qk_norm_scope == "all" else 2) * D if cfg.qk_norm else 0
    fc_out = 2 * F_ if cfg.mlp in ("swiglu", "geglu") else F_
    mlp = C * fc_out + F_ * C + ((fc_out + C) if cfg.bias else 0)
    block = (4 if cfg.norm_position == "sandwich" else 2) * norm + attn + qk + mlp
    emb = V * C + (cfg.context_len * C if cfg.pos_emb == "learned" else 0)
    head = 0 if cfg.tie_embeddings else V * C
    final = norm if cfg.norm_position != "post" else 0
    return cfg.n_layer * block + emb + head + final


@pytest.mark.parametrize("name", list(PRESETS))
def test_param_counts_match_formula(name):
    cfg = get_preset(name)
    with torch.device("meta"):
        model = GPT(cfg)
    assert model.num_params() == expected_params(cfg)
    emb = cfg.padded_vocab * cfg.n_embd * (1 if cfg.tie_embeddings else 2)
    emb += cfg.context_len * cfg.n_embd if cfg.pos_emb == "learned" else 0
    assert model.num_params(embeddings=False) == model.num_params() - emb


def test_gpt2_124m_matches_known_numbers():
    with torch.device("meta"):
        model = GPT(get_preset("gpt2-124m"))
    assert model.num_params() == 124_475_904  # GPT-2 small with vocab padded to 50304
    # 6N + 12·L·d·T at T=1024 with N = 123.6M (position table left out): 0.855 GFLOP
    assert model.flops_per_token(1024) == 6 * (124_475_904 - 1024 * 768) + 12 * 12 * 768 * 1024
    assert abs(model.flops_per_token(1024) / 1e9 - 0.855) < 0.001


def test_exact_flops_count_gqa_swiglu_window():
    cfg = small(n_kv_head=1, mlp="swiglu", sliding_window=8)
    model = GPT(cfg)
    C, H, KV, D, F_, V = 32, 4, 1, 8, cfg.hidden_dim, cfg.padded_vocab
    matmul_per_layer = C * (H + 2 * KV) * D + H * D * C + C * 2 * F_ + F_ * C
    expected = 6 * (2 * matmul_per_layer + C * V) + 12 * 2 * H * D * min(24, 8)
    assert model.flops_per_token(24, exact=True) == expected


def test_interleaved_windows_and_their_own_rope():
    """sliding_window_pattern: layer i full where (i + 1) % pattern == 0, else windowed; rope_local_theta: the windowed
    layers' RoPE base. Each layer's mask and tables are its own: the model equals one whose layers are run one by one
    with a mask and tables built for that layer alone."""
    from redline.model import rope_tables

    cfg = small(n_layer=3, sliding_window=4, sliding_window_pattern=3, rope_local_theta=100.0)
    assert [cfg.layer_window(i) for i in range(3)] == [4, 4, 0] and cfg.windows == [0, 4]
    model = GPT(cfg).eval()
    idx = torch.randint(0, 101, (2, 12))
    T = idx.shape[1]
    x = model.wte(idx)
    for block in model.blocks:
        layer_cfg = replace(cfg, rope_theta=100.0) if block.attn.window else cfg
        cos, sin = (t[:T] for t in rope_tables(layer_cfg))
        i = torch.arange(T)
        mask = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < (block.attn.window or T))
        x = block(x, (cos, sin, cos, sin), mask)
    with torch.no_grad():
        torch.testing.assert_close(model(idx), model.logits(model.norm_f(x))[..., :101])
    # exact FLOPs: two layers attend to 4 of 12 tokens, one to all 12
    C, H, D, F_, V = 32, 4, 8, cfg.hidden_dim, cfg.padded_vocab
    matmul = 3 * (C * (H + 2 * 2) * D + H * D * C + C * 2 * F_ + F_ * C) + C * V
    assert model.flops_per_token(12, exact=True) == 6 * matmul + 12 * H * D * (4 + 4 + 12)


def test_any_windowed_layers_and_a_rope_base_per_layer():
    """window_layers: exactly the named layers attend to the window (here the first layer full, as Granite SWA's);
    rope_layer_theta: each layer rotates by its own base's table, scaled by rope_scaling as every one is, and a 0
    layer not at all. The model equals its layers run one by one with a mask and tables built for each alone."""
    from redline.model import rope_tables

    thetas = (0.0, 100.0, 10000.0, 100.0)
    cfg = small(n_layer=4, sliding_window=3, window_layers=(1, 2, 3), rope_layer_theta=thetas, rope_scaling="linear",
                rope_factor=2.0)
    assert [cfg.layer_window(i) for i in range(4)] == [0, 3, 3, 3] and cfg.windows == [0, 3]
    assert cfg.rope_bases == [(100.0, True), (10000.0, True)]
    model = GPT(cfg).eval()
    assert [b.attn.use_rope for b in model.blocks] == [False, True, True, True]
    idx = torch.randint(0, 101, (2, 10))
    T = idx.shape[1]
    x = model.wte(idx)
    i = torch.arange(T)
    for block, theta in zip(model.blocks, thetas):
        cos, sin = (t[:T] for t in rope_tables(replace(cfg, rope_theta=theta or 1.0)))
        mask = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < (block.attn.window or T))
        x = block(x, (cos, sin) * 2 if theta else (torch.full_like(cos, float("nan")),) * 4, mask)
    with torch.no_grad():
        torch.testing.assert_close(model(idx), model.logits(model.norm_f(x))[..., :101])
    # a pattern's layers named one by one: sliding_window_pattern=2 windows layers 0 and 2
    by_list, by_pattern = small(n_layer=4, sliding_window=3, window_layers=(0, 2)), small(
        n_layer=4, sliding_window=3, sliding_window_pattern=2)
    assert [by_list.layer_window(i) for i in range(4)] == [by_pattern.layer_window(i) for i in range(4)]
    for bad in ({"window_layers": (1,)}, {"sliding_window": 3, "window_layers": (2, 1)},
                {"sliding_window": 3, "window_layers": (4,)},
                {"sliding_window": 3, "sliding_window_pattern": 2, "window_layers": (1,)},
                {"rope_layer_theta": (1.0, 2.0)}, {"rope_layer_theta": (1.0, 2.0, 3.0, -1.0)},
                {"rope_layer_theta": (1.0,) * 4, "nope_interval": 2},
                {"rope_layer_theta": (1.0,) * 4, "rope_local_theta": 5.0}):
        with pytest.raises(UserError, match="window_layers|rope_layer_theta"):
            small(n_layer=4, **bad).validate()


def test_head_gate_and_proportional_rope():
    """attn_gate=head: each head's output times sigmoid(gate · x) before the output projection (a gate of +inf is
    the ungated model); rope_scaling=proportional: the first rope_proportion of the pairs turn at base^(-2i/D) over
    rope_factor, the rest stay still."""
    from redline.model import rope_frequencies

    cfg = small(attn_gate="head", n_kv_head=2)
    gated = GPT(cfg).eval()
    plain = GPT(replace(cfg, attn_gate="none")).eval()
    plain.load_state_dict({k: v for k, v in gated.state_dict().items() if ".attn.gate." not in k})
    idx = torch.randint(0, 101, (2, 7))
    with torch.no_grad():
        assert not torch.allclose(gated(idx), plain(idx), atol=1e-3)
        for block in gated.blocks:
            block.attn.gate.weight.zero_()
            block.attn.gate.weight[:, 0] = 1e4  # x's first feature times 1e4: sigmoid 0 or 1 by its sign
        x = gated.blocks[0].norm1(gated.wte(idx))
        y = torch.randn(2, 7, 32)
        expected = y.view(2, 7, 4, 8) * (x[..., :1] > 0).float().unsqueeze(-1)
        torch.testing.assert_close(gated.blocks[0].attn.gated(x, y), expected.view(2, 7, 32))
    freqs = rope_frequencies(small(head_size=16, rope_theta=100.0, rope_scaling="proportional", rope_proportion=0.5,
                                   rope_factor=2.0))
    expected = torch.tensor([100.0 ** (-i / 16) / 2 for i in (0, 2, 4, 6)] + [0.0] * 4)
    torch.testing.assert_close(freqs, expected)
    with pytest.raises(UserError, match="rope_proportion"):
        small(rope_proportion=0.5).validate()


def test_gemma_norm_and_embedding_scale():
    """norm_unit_offset: RMSNorm by 1 + weight in fp32, weights starting at zero; embed_scale: sqrt(C) rounded to the
    embedding's dtype."""
    model = GPT(small(norm_unit_offset=True, qk_norm=True, embed_scale=True, norm_position="sandwich"))
    norm = model.blocks[0].attn_out_norm
    assert torch.equal(norm.weight, torch.zeros(32)) and torch.equal(model.blocks[0].attn.q_norm.weight, torch.zeros(8))
    with torch.no_grad():
        norm.weight.fill_(0.5)
    x = torch.randn(3, 32)
    torch.testing.assert_close(norm(x), 1.5 * x / x.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt())
    idx = torch.randint(0, 101, (1, 5))
    torch.testing.assert_close(model.embed(idx)[0], model.wte(idx) * 32 ** 0.5)
    half = GPT(small(embed_scale=True)).bfloat16()
    scale = torch.tensor(32 ** 0.5).bfloat16()
    assert torch.equal(half.embed(idx)[0], half.wte(idx) * scale)


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_weightless_norms_and_the_embeddings_norm(norm):
    """norm_affine=false: no norm has a parameter (QK-norm included), each normalizes alone; embed_norm: the
    embeddings reach the first block normalized."""
    model = GPT(small(norm=norm, norm_affine=False, embed_norm=True, qk_norm=True))
    assert not [name for name, _ in model.named_parameters() if "norm" in name]
    x = torch.randn(3, 32) * 3 + 1
    centred = x - x.mean(-1, keepdim=True) if norm == "layernorm" else x
    expected = centred / centred.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt()
    torch.testing.assert_close(model.blocks[0].norm1(x), expected)
    torch.testing.assert_close(model.embed_norm(x), expected)
    idx = torch.randint(0, 101, (1, 5))
    raw = model.wte(idx)
    torch.testing.assert_close(model.embed(idx)[0], model.embed_norm(raw))
    assert not torch.allclose(model.embed(idx)[0], raw)


def test_partial_rope_parallel_block_and_exact_gelu_compute_what_they_say():
    """rope_dims: the first R dims of each head rotate as a whole-head RoPE of width R would, the rest pass as they
    are; parallel_residual: x + attn(norm1(x)) + mlp(norm2(x)); gelu_approximate=none: the erf GELU."""
    from redline.model import apply_rope, rope_tables

    cfg = small(rope_dims=4)
    cos, sin = rope_tables(cfg, 6)
    assert cos.shape == (6, 2)
    x = torch.randn(2, 4, 6, cfg.head_dim)
    out = apply_rope(x, cos, sin)
    torch.testing.assert_close(out[..., :4], apply_rope(x[..., :4], cos, sin))
    assert torch.equal(out[..., 4:], x[..., 4:]) and not torch.equal(out[..., :4], x[..., :4])
    model = GPT(small(parallel_residual=True, mlp="gelu", gelu_approximate="none")).eval()
    block, h = model.blocks[0], torch.randn(1, 5, 32)
    rope = tuple(t[:5] for t in rope_tables(model.cfg))
    with torch.no_grad():
        want = h + block.attn(block.norm1(h), rope) + block.mlp(block.norm2(h))
        torch.testing.assert_close(block(h, rope), want)
        u = torch.randn(3, 32)
        mlp = block.mlp
        torch.testing.assert_close(mlp(u), mlp.proj(torch.nn.functional.gelu(mlp.fc(u))))
    shared = GPT(small(parallel_residual=True, parallel_shared_norm=True, head_bias=True)).eval()
    block = shared.blocks[0]
    assert block.norm2 is None and shared.lm_head.bias is not None
    with torch.no_grad():
        u = block.norm1(h)
        torch.testing.assert_close(block(h, rope), h + block.attn(u, rope) + block.mlp(u))


def test_hidden_sizes_rounded_to_64():
    assert small(mlp="swiglu").hidden_dim % 64 == 0
    assert get_preset("modern-124m").hidden_dim == 2048  # 8/3 · 768
    assert get_preset("gpt2-124m").hidden_dim == 3072


@pytest.mark.parametrize(
    "overrides,fragment",
    [
        (dict(n_head=5), "does not divide model.n_embd"),
        (dict(n_kv_head=3), "does not divide model.n_head"),
        (dict(dropout=1.5), "dropout"),
        (dict(n_layer=0), "n_layer"),
        (dict(rope_dims=3), "model.rope_dims=3 needs RoPE"),  # odd
        (dict(rope_dims=4, pos_emb="learned"), "model.rope_dims=4 needs RoPE"),
        (dict(rope_dims=64), "up to the head width 8"),
        (dict(parallel_residual=True, norm_position="post"), "parallel_residual needs pre-norm blocks"),
        (dict(parallel_shared_norm=True), "parallel_shared_norm needs model.parallel_residual"),
        (dict(norm_bias=True), "model.norm_bias needs model.norm=layernorm"),
        (dict(nope_interval=2, pos_emb="learned"), "model.nope_interval=2 needs RoPE"),
        (dict(attn_softcap=-1.0), "model.attn_softcap must be >= 0"),
        (dict(qk_norm_after_rope=True), "model.qk_norm_after_rope needs per-head QK-norm"),
        (dict(rope_scaling="longrope", rope_pair_factors=(1.0, 2.0)), "rope_scaling=longrope needs 4 "
                                                                        "model.rope_pair_factors"),
        (dict(rope_pair_factors=(1.0, 2.0)), "model.rope_pair_factors are LongRoPE's"),
        (dict(residual_multiplier=-1.0), "residual_multiplier and logit_divisor must be >= 0"),
        (dict(embed_multiplier=2.0, embed_scale=True), "give the embeddings' factor one way"),
        (dict(norm_affine=False, norm_unit_offset=True), "model.norm_affine=false"),
        (dict(logit_divisor=2.0, ce_chunk_tokens=64), "model.logit_divisor with model.ce_chunk_tokens"),
        (dict(pos_emb="alibi", attn_softcap=5.0), "model.pos_emb=alibi adds its bias through SDPA"),
        (dict(pos_emb="alibi", doc_attention="flex"), "does not take .*doc_attention=flex"),
    ],
)
def test_invalid_configs_are_user_errors(overrides, fragment):
    with pytest.raises(UserError, match=fragment):
        GPT(small(**overrides))


def test_sequence_longer_than_context():
    model = GPT(small())
    with pytest.raises(UserError, match="context_len"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_generate_never_samples_padding():
    torch.manual_seed(0)
    model = GPT(small()).eval()
    with torch.no_grad():
        model.lm_head.weight[101:] = 100.0  # padded rows would win every argmax if they were sampled
    out = model.generate(torch.zeros(2, 1, dtype=torch.long), 10, temperature=1.0)
    assert out.max().item() < 101


@pytest.mark.slow
def test_compile_matches_eager():
    torch.manual_seed(0)
    model = GPT(small()).eval()
    idx = torch.randint(0, 101, (2, 16))
    with torch.no_grad():
        eager = model(idx)
        compiled = torch.compile(model)(idx)
    assert torch.allclose(eager, compiled, atol=1e-4, rtol=1e-4)


def test_head_size_apart_from_the_width_matches_the_reference():
    """Qwen3's layout: heads wider than n_embd / n_head (here 4 heads of 16 on a width of 32)."""
    torch.manual_seed(2)
    model = GPT(small(head_size=16, qk_norm=True)).double()
    attn = model.blocks[0].attn
    assert attn.qkv.weight.shape == ((4 + 2 * 2) * 16, 32) and attn.proj.weight.shape == (32, 64)
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    _, rope = model.embed(torch.zeros(2, 12, dtype=torch.long))
    ours = attn(x, tuple(t.double() for t in rope))
    assert torch.allclose(ours, reference_attention(model, x), atol=1e-10, rtol=1e-8)
    assert model(torch.randint(0, 101, (2, 12))).shape == (2, 12, 101)


def test_qkv_bias_alone():
    """Qwen2's layout: biases on q, k and v only."""
    model = GPT(small(qkv_bias=True, fused_qkv=False))
    names = {n for n, _ in model.named_parameters() if n.endswith(".bias")}
    assert names == {f"blocks.{i}.attn.{p}.bias" for i in range(2) for p in "qkv"}
    assert not {n for n, _ in GPT(small(bias=True, qkv_bias=False)).named_parameters() if ".attn.q" in n and "bias" in n}


def test_qk_norm_over_whole_projections():
    """OLMo 2's QK-norm: one RMSNorm over all of q's heads (H·D weights) and one over k's (KV·D); with one head of
    each it is the per-head norm with the same weights."""
    model = GPT(small(qk_norm=True, qk_norm_scope="all", n_kv_head=2))
    attn = model.blocks[0].attn
    assert attn.q_norm.weight.shape == (4 * 8,) and attn.k_norm.weight.shape == (2 * 8,)
    torch.manual_seed(0)
    whole, per_head = (GPT(small(n_embd=8, n_head=1, n_kv_head=1, qk_norm=True, qk_norm_scope=scope))
                       for scope in ("all", "head"))
    with torch.no_grad():
        for p in whole.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    per_head.load_state_dict(whole.state_dict())
    idx = torch.randint(0, 101, (2, 9))
    torch.testing.assert_close(whole(idx), per_head(idx))


@pytest.mark.parametrize("overrides", [{}, {"pos_emb": "learned"}, {"sliding_window": 3}, {"pos_emb": "alibi"},
                                       {"pos_emb": "alibi", "sliding_window": 3, "n_head": 2, "n_kv_head": 1},
                                       {"sliding_window": 3, "sliding_window_pattern": 2, "rope_local_theta": 100.0}])
def test_packed_documents_equal_each_document_alone(overrides):
    """Documents packed into one row with doc_ids and restarting positions see only themselves."""
    torch.manual_seed(3)
    model = GPT(small(**overrides)).eval()
    a, b = torch.randint(0, 101, (1, 7)), torch.randint(0, 101, (1, 5))
    packed = torch.cat([a, b], dim=1)
    doc_ids = torch.tensor([[0] * 7 + [1] * 5])
    positions = torch.tensor([list(range(7)) + list(range(5))])
    together = model(packed, positions=positions, doc_ids=doc_ids)
    torch.testing.assert_close(together[:, :7], model(a), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(together[:, 7:], model(b), atol=1e-5, rtol=1e-5)


def test_llama3_rope_scaling_matches_transformers():
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from redline.model import rope_frequencies

    hf = transformers.LlamaConfig(hidden_size=256, num_attention_heads=4, rope_theta=500000.0,
                                  max_position_embeddings=131072,
                                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    cfg = ModelConfig(n_embd=256, n_head=4, rope_theta=500000.0, rope_scaling="llama3", rope_factor=8.0,
                      rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_context=8192)
    torch.testing.assert_close(rope_frequencies(cfg), expected.float())
    linear = replace(cfg, rope_scaling="linear", rope_factor=2.0)
    torch.testing.assert_close(rope_frequencies(linear), rope_frequencies(replace(cfg, rope_scaling="none")) / 2)


CAPPED = dict(vocab_size=101, context_len=256, n_layer=2, n_embd=32, n_head=4, n_kv_head=2, attn_softcap=1.5,
              attn_scale=0.3, sliding_window=40, sliding_window_pattern=2)  # Gemma 2's attention, a cap that bites


def _capped_pair(device: str, **kw) -> tuple[GPT, GPT]:
    """The same Gemma-2-like model with its capped scores as plain products and as flex attention."""
    torch.manual_seed(0)
    plain = GPT(ModelConfig(**{**CAPPED, **kw}, doc_attention="sdpa")).to(device)
    with torch.no_grad():
        for block in plain.blocks:  # scores of a few units (at init they are ~0.01), for the cap to bite
            block.attn.qkv.weight.mul_(10)
    flex = GPT(ModelConfig(**{**CAPPED, **kw}, doc_attention="flex")).to(device)
    flex.load_state_dict(plain.state_dict())
    return plain, flex


@pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")
@pytest.mark.parametrize("documents", [False, True])
def test_capped_attention_as_flex_equals_the_plain_products(documents):
    # flex attention with the cap as its score modifier (how training runs it on CUDA) against the plain products;
    # the CPU has no flex backward (the GPU test below compares gradients)
    plain, flex = _capped_pair("cpu")
    g = torch.Generator().manual_seed(1)
    idx, targets = torch.randint(0, 101, (2, 150), generator=g), torch.randint(0, 101, (2, 150), generator=g)
    doc_ids = (torch.arange(150) >= 70).long().expand(2, -1) if documents else None  # across flex's 128-token blocks
    assert not isinstance(flex.attention_mask(150, "cpu", doc_ids, 40), torch.Tensor)  # a BlockMask: flex runs
    with torch.no_grad():
        losses = [model(idx, targets, doc_ids=doc_ids) for model in (plain, flex)]
        torch.testing.assert_close(losses[1], losses[0])
        uncapped = GPT(ModelConfig(**{**CAPPED, "attn_softcap": 0.0}, doc_attention="flex"))
        uncapped.load_state_dict(plain.state_dict())
        assert (uncapped(idx, targets, doc_ids=doc_ids) - losses[0]).abs() > 1e-3  # the cap changes the loss


def _sink_reference(q, k, v, allowed, sinks, scale):
    """GPT-OSS's eager attention (transformers' models/gpt_oss/modeling_gpt_oss.py) in fp64: the sink appended to each
    query's scores as one more column, softmax, that column dropped. q (B, H, T, D), k/v (B, KV, T, D), allowed
    (B, 1, T, T) bool -> (B, T, H*D)."""
    B, H, T, D = q.shape
    k, v = (t.double().repeat_interleave(H // k.shape[1], dim=1) for t in (k, v))
    scores = (q.double() @ k.transpose(-1, -2) * scale).masked_fill(~allowed, float("-inf"))
    column = sinks.double().view(1, H, 1, 1).expand(B, H, T, 1)
    probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    return (probs @ v).transpose(1, 2).reshape(B, T, H * D)


@pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")
@pytest.mark.parametrize("path", ["explicit", "flex"])
def test_attention_sinks_equal_an_extra_softmax_column(path):
    """attn_sinks against the reference's extra column, with GQA (4 heads on 2), a window shorter than the sequence
    and two packed documents: the plain products (the CPU's path) and flex attention with its logsumexp (training's
    on CUDA, eager here)."""
    cfg = ModelConfig(vocab_size=101, context_len=256, n_layer=2, n_embd=32, n_head=4, n_kv_head=2, attn_sinks=True,
                      sliding_window=40, doc_attention="sdpa" if path == "explicit" else "flex")
    torch.manual_seed(0)
    model = GPT(cfg)
    attn = model.blocks[0].attn
    assert torch.equal(attn.sinks, torch.zeros(4))  # reset_parameters: zeros
    g = torch.Generator().manual_seed(1)
    B, T = 2, 150
    q = torch.randn(B, 4, T, 8, generator=g) * 2
    k, v = torch.randn(B, 2, T, 8, generator=g) * 2, torch.randn(B, 2, T, 8, generator=g)
    doc_ids = torch.stack([(torch.arange(T) >= 70).long(), (torch.arange(T) >= 20).long()])
    i = torch.arange(T)
    allowed = ((doc_ids[:, :, None] == doc_ids[:, None, :]) & (i[:, None] >= i[None, :])
               & (i[:, None] - i[None, :] < 40))[:, None]
    with torch.no_grad():
        attn.sinks.copy_(torch.tensor([-1.0, 0.5, 2.0, 4.0]))  # a sink that takes most of a head, one that takes little
        mask = model.attention_mask(T, "cpu", doc_ids, attn.window)
        assert isinstance(mask, torch.Tensor) == (path == "explicit")
        got = attn.attend(q, k, v, mask, is_causal=False)
    want = _sink_reference(q, k, v, allowed, attn.sinks.detach(), 8 ** -0.5)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    plain = _sink_reference(q, k, v, allowed, torch.full((4,), -torch.inf), 8 ** -0.5)
    assert (got.double() - plain).abs().max() > 0.1  # the sinks change the output


def test_attention_sinks_train_as_gains():
    """The sinks get gradients and go to the optimizer's 1-D group (AdamW, no weight decay; never Muon's)."""
    from redline.training.optim import param_groups

    torch.manual_seed(0)
    model = GPT(small(attn_sinks=True))
    idx = torch.randint(0, 101, (2, 9))
    model(idx, idx).backward()
    sinks = [block.attn.sinks for block in model.blocks]
    assert all(s.shape == (4,) and s.grad is not None and s.grad.abs().sum() > 0 for s in sinks)
    hidden, _, gains = param_groups(model)
    assert all(any(s is p for p in gains) and not any(s is p for p in hidden) for s in sinks)
    with torch.device("meta"):  # a model built on meta and materialized: reset_parameters gives zeros again
        empty = GPT(small(attn_sinks=True))
    empty.to_empty(device="cpu")
    empty.reset_parameters()
    assert all(torch.equal(block.attn.sinks, torch.zeros(4)) for block in empty.blocks)


def _assert_compiled_flex_trains_as_plain(plain: GPT, flex: GPT) -> None:
    """One fp32 training step of `flex` compiled (its attention as flex on CUDA) against `plain`'s plain products,
    the same weights: loss and every gradient alike."""
    idx = torch.randint(0, 101, (2, 512), device="cuda")
    losses = []
    for model in (plain, torch.compile(flex)):
        loss = model(idx, idx)
        loss.backward()
        losses.append(loss.item())
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)
    for (name, a), b in zip(plain.named_parameters(), flex.parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-4, rtol=1e-3, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_attention_sinks_train_as_compiled_flex_on_gpu():
    """doc_attention=auto compiled on CUDA runs sinks as flex attention, the sink through its logsumexp: loss and
    gradients (the sinks' included) against the plain products, in fp32."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=101, context_len=512, n_layer=2, n_embd=64, n_head=4, n_kv_head=2, attn_sinks=True,
                      sliding_window=40, sliding_window_pattern=2, doc_attention="sdpa")
    plain = GPT(cfg).cuda()
    with torch.no_grad():
        for block in plain.blocks:
            block.attn.sinks.normal_(0.0, 2.0)
    flex = GPT(replace(cfg, doc_attention="auto")).cuda()
    flex.load_state_dict(plain.state_dict())
    _assert_compiled_flex_trains_as_plain(plain, flex)
    # compiled here with attn_softcap 0, GPT.forward recompiled for another cap would take the cap as a symbolic float
    # (dynamo's automatic dynamic), which flex attention's score_mod cannot hold: start the next test afresh
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_capped_attention_trains_as_compiled_flex_on_gpu():
    """doc_attention=auto compiled on CUDA (the training step) runs capped scores as flex attention: loss and
    gradients against the plain products, in fp32."""
    plain, flex = _capped_pair("cuda", n_embd=64, context_len=512)
    flex.cfg.doc_attention = "auto"
    _assert_compiled_flex_trains_as_plain(plain, flex)


def test_logit_softcap_and_zero_init_projections():
    torch.manual_seed(0)
    capped = GPT(small(logit_softcap=2.0))
    logits = capped(torch.randint(0, 101, (2, 9)))
    assert logits.abs().max() < 2.0 and torch.isfinite(capped(torch.randint(0, 101, (2, 9)), torch.randint(0, 101, (2, 9))))
    zero = GPT(small(zero_init_proj=True))
    assert all(block.attn.proj.weight.abs().max() == 0 and block.mlp.proj.weight.abs().max() == 0
               for block in zero.blocks)
    with pytest.raises(UserError, match="logit_softcap"):
        GPT(small(logit_softcap=2.0, ce_chunk_tokens=8))


@pytest.mark.parametrize("heads", [8, 12, 6])
def test_alibi_slopes_are_bloom_and_mpt_slopes(heads):
    """redline's ALiBi slopes against transformers' own: BLOOM's _get_alibi_slopes (the interleaved extra slopes of a
    head count that is not a power of two) and MPT's build_mpt_alibi_tensor at its default alibi_bias_max 8, whose
    key-position bias (..., j - (T - 1)) is the slope times the distance to the last key."""
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    from redline.model import alibi_bias, alibi_slopes

    ours = alibi_slopes(heads)
    torch.testing.assert_close(ours, _get_alibi_slopes(heads, torch.device("cpu")), rtol=1e-6, atol=0)
    mpt = build_mpt_alibi_tensor(heads, 5)  # (H, 1, 5): slope · (j - 4)
    torch.testing.assert_close(ours, -mpt[:, 0, 0] / 4, rtol=1e-6, atol=0)
    assert len(set(ours.tolist())) == heads and (ours > 0).all()
    # the bias: -m_h (i - j), (H, Tq, Tk)
    bias = alibi_bias(heads, torch.tensor([3]), torch.arange(5))
    torch.testing.assert_close(bias[:, 0], ours[:, None] * (torch.arange(5) - 3.0))


def test_alibi_attends_by_distance_alone():
    """ALiBi has no position table, and the bias depends on distance only: a sequence's logits do not change with
    the positions it is given as long as they keep their spacing; spacing them apart changes them."""
    torch.manual_seed(4)
    model = GPT(small(pos_emb="alibi", n_head=6, n_embd=48, n_kv_head=3)).eval()
    assert model.wpe is None and not any("rope" in n for n, _ in model.named_buffers())
    idx = torch.randint(0, 101, (2, 11))
    base = model(idx)
    torch.testing.assert_close(model(idx, positions=torch.arange(11) + 9), base)
    assert (model(idx, positions=torch.arange(11) * 2) - base).abs().max() > 1e-3
