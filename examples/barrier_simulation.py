"""Compare barriers on 200 simulated workers (the same decision code the engines use).

    python examples/barrier_simulation.py
"""
from actorpy.barrier import ASP, BSP, PSP, SSP, SimConfig, Workload, simulate


def main() -> None:
    # a fifth of the workers are persistent stragglers, 4x slower
    workload = Workload(dist="exp", mean_s=1.0, straggler_frac=0.2, straggler_slowdown=4.0)
    config = SimConfig(workers=200, seconds=200, workload=workload, seed=7)
    for policy in (BSP(), SSP(staleness=4), PSP(sample=8, staleness=2), ASP()):
        st = simulate(policy, config).stats()
        print(f"{policy!r:<30} mean steps {st['mean']:7.1f}  spread {st['max'] - st['min']:4.0f}")


if __name__ == "__main__":
    main()
