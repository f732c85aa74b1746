"""Ask/tell on a non-smooth, simulator-style black box, scored a whole step at once.

The "simulator" launches a projectile at (angle, speed) over a stepped terrain with a wall:
the score is how far it lands from a target, with flat regions (it hits the wall), jumps
(which terrace it lands on) and a discretised clock, so it has no useful gradient. A swarm
of 64 starting points is optimised together; each ask() is one matrix of candidates that
the vectorised numpy simulator scores in one call.

    python3 examples/python/asktell_simulator.py
"""
import os

import numpy as np

import polyprobe

FAST = os.environ.get("POLYPROBE_EXAMPLES_FAST") == "1"


def simulate(params: np.ndarray) -> np.ndarray:
    """Distance to the target for each row (angle in [0, 1] -> 5..85 deg, speed in [0, 1])."""
    angle = np.deg2rad(5 + 80 * np.clip(params[:, 0], 0, 1))
    speed = 5 + 25 * np.clip(params[:, 1], 0, 1)
    dt, g, target, wall_x, wall_h = 0.05, 9.81, 42.0, 20.0, 6.0
    x = np.zeros(len(params))
    y = np.zeros(len(params))
    vx, vy = speed * np.cos(angle), speed * np.sin(angle)
    alive = np.ones(len(params), bool)
    for _ in range(200):  # a fixed-step clock: the landing point moves in jumps
        x = np.where(alive, x + vx * dt, x)
        y = np.where(alive, y + vy * dt, y)
        vy = np.where(alive, vy - g * dt, vy)
        ground = np.floor(x / 8.0)  # terraces one unit high every 8 m
        hit_wall = alive & (np.abs(x - wall_x) < 0.5) & (y < wall_h)
        landed = alive & (y <= ground) & (vy < 0)
        x = np.where(hit_wall, wall_x, x)
        alive &= ~(hit_wall | landed)
    miss = np.abs(x - target)
    return miss + 0.1 * np.round(speed)  # and a discretised energy cost


def main() -> None:
    rng = np.random.default_rng(0)
    opt = polyprobe.AskTell(rng.uniform(0, 1, size=(64, 2)),
                            {"step_radius": 1.0, "probe_radius": 1.0, "epsilon": 0.05,
                             "solver": "softmax", "radius_model": "adaptive"})
    steps = 15 if FAST else 60
    for step in range(steps):
        X = opt.ask()               # every candidate of this step: one (rows, 2) matrix
        info = opt.tell(simulate(X))  # scored at once
        if step % max(1, steps // 5) == 0:
            print(f"step {step:3d}  candidates {info['candidates']}  best {opt.best_loss:.3f}")
    best = opt.best_point
    print(f"best: angle {5 + 80 * best[0]:.1f} deg, speed {5 + 25 * best[1]:.2f} m/s, "
          f"score {opt.best_loss:.3f} after {opt.evaluations} evaluations")
    assert opt.best_loss < simulate(rng.uniform(0, 1, size=(64, 2))).min()


if __name__ == "__main__":
    main()
