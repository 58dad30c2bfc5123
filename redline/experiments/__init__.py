"""Experiments: run a matrix of training runs, then read what they wrote and say what it means.

    recipes.py    a recipe (TOML or YAML) → the list of runs it asks for (presets × variants × precision ×
                  batch × seeds), each with its own config file; built-in recipes live in recipes/
    sweep.py      runs them one subprocess at a time, resumably, appending to results.jsonl
    processes.py  each run's process group, the GPU memory it leaves, its error line, one sweep per folder
    results.py    one run directory → one summary record; a result set → cells (a configuration over seeds)
                  and their comparison with the baseline
    stats.py      mean/std, Welch's t-test and interval, ratio intervals, an exact permutation test
    claims.py     the source design's claims (claims.toml) set against our measurements
    plots.py      PNG plots (matplotlib, Agg)
    dashboard.py  one self-contained offline HTML dashboard, and a small server that keeps it fresh
    report.py     report.md, results.json, results.csv, plots and dashboard for a run or a sweep

Reporting only reads run artefacts (config.json, metrics.jsonl, results.jsonl); nothing here is threaded
through the training loop.
"""
