"""polyprobe against Optuna's TPE sampler at equal evaluation budgets.

Both minimise the same black boxes through their Python APIs and are charged the same
number of objective calls: a smooth but curved valley (Rosenbrock, 6-D), and a non-smooth,
multimodal one (Rastrigin with a staircase, 4-D). polyprobe runs `minimize` with the
recommended configuration for smooth functions and ask/tell for the swarm; Optuna runs
TPESampler (Debian's python3-optuna). Lower is better; several seeds each.

    python3 examples/python/compare_optuna.py
"""
import os
import time

import numpy as np

import polyprobe

FAST = os.environ.get("POLYPROBE_EXAMPLES_FAST") == "1"


def rosenbrock(x):
    return float(np.sum(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2))


def stair_rastrigin(x):
    z = np.floor(x * 4) / 4
    return float(10 * len(z) + np.sum(z ** 2 - 10 * np.cos(2 * np.pi * z)))


PROBLEMS = [("rosenbrock-6d", rosenbrock, 6, -2.0, 2.0, "minimize"),
            ("stair-rastrigin-4d", stair_rastrigin, 4, -5.12, 5.12, "asktell")]


def run_polyprobe(f, n, lo, hi, budget, seed, how):
    rng = np.random.default_rng(seed)
    if how == "minimize":
        x0 = rng.uniform(lo, hi, n)
        config = polyprobe.recommended_minimize_config(n).replace(seed=seed)
        return polyprobe.minimize(f, x0, budget, config).f
    # A swarm of 8 points, each its own particle; stop at the budget.
    opt = polyprobe.AskTell(rng.uniform(lo, hi, (8, n)),
                            {"seed": seed, "step_radius": 1.0, "probe_radius": 1.0,
                             "epsilon": 0.5, "solver": "softmax", "radius_model": "adaptive"})
    used = 0
    while True:
        X = opt.ask()
        if used + len(X) > budget:
            break
        opt.tell(np.array([f(np.clip(x, lo, hi)) for x in X]))
        used += len(X)
    return opt.best_loss


def run_optuna(optuna, f, n, lo, hi, budget, seed):
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed))
    study.optimize(lambda t: f(np.array([t.suggest_float(f"x{i}", lo, hi) for i in range(n)])),
                   n_trials=budget)
    return study.best_value


def main() -> None:
    try:
        import optuna
    except ImportError:
        print("optuna is not installed (Debian: apt-get install python3-optuna); skipping")
        return
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    budget = 30 if FAST else 300
    seeds = range(1 if FAST else 5)
    print(f"budget {budget} evaluations, {len(seeds)} seeds; median best value (lower is better)")
    for name, f, n, lo, hi, how in PROBLEMS:
        t0 = time.perf_counter()
        pp = [run_polyprobe(f, n, lo, hi, budget, s, how) for s in seeds]
        t1 = time.perf_counter()
        op = [run_optuna(optuna, f, n, lo, hi, budget, s) for s in seeds]
        t2 = time.perf_counter()
        print(f"{name:20s} polyprobe ({how}) {np.median(pp):10.4f}  [{t1 - t0:5.2f} s]   "
              f"optuna TPE {np.median(op):10.4f}  [{t2 - t1:5.2f} s]")


if __name__ == "__main__":
    main()
