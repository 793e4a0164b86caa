"""The expert-parallel configuration, validated in one place (errors name the option and its range)."""

from __future__ import annotations

from dataclasses import dataclass

# DeepInfer's DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS lower bound as the issue fixes it; the rounding rule
# below raises it until routed + redundant divides by the EP size.
DEFAULT_EXTRA_EXPERTS = 32
DEFAULT_WINDOW = 1000  # steps of per-expert token counts kept for a rebalance
DEFAULT_INTERVAL = 10000  # steps between rebalances (0: never)


@dataclass(frozen=True)
class EPConfig:
    ep: int = 1  # ranks of the expert-parallel group (= data-parallel attention ranks)
    extra_experts: int = DEFAULT_EXTRA_EXPERTS  # lower bound of redundant experts per MoE (ep > 1)
    window: int = DEFAULT_WINDOW
    interval: int = DEFAULT_INTERVAL
    timeout_s: float = 60.0  # a collective that waits longer ends the group with an error
    # rows each rank pair's exchange carries, padded (static shapes for capture; a layer that needs more
    # takes the exact dynamic exchange); 0: exactly the routed rows
    capacity: int = 0

    def __post_init__(self) -> None:
        if self.ep < 1:
            raise ValueError(f"--ep is {self.ep}, expected an integer >= 1")
        if self.extra_experts < 0:
            raise ValueError(f"extra_experts is {self.extra_experts}, expected >= 0")
        if self.window < 1:
            raise ValueError(f"eplb window is {self.window}, expected >= 1")
        if self.interval < 0 or (self.interval and self.window > self.interval):
            raise ValueError(
                f"eplb interval is {self.interval}, expected 0 (never) or >= the window ({self.window})"
            )
        if self.capacity < 0:
            raise ValueError(
                f"capacity is {self.capacity}, expected 0 (exact rows) or >= 1 rows per rank pair"
            )
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s is {self.timeout_s}, expected > 0")


def num_redundant(routed: int, ep: int, minimum: int, what: str = "experts") -> int:
    """DeepInfer's rule: at least `minimum` redundant experts, rounded up until (routed + redundant)
    divides by `ep`. One rank has nothing to balance: no redundant experts."""
    if routed < 1:
        raise ValueError(f"{what}: {routed} routed experts, expected >= 1")
    if ep == 1:
        return 0
    extra = minimum + (-(routed + minimum) % ep)
    if (routed + extra) // ep < 1:
        raise ValueError(
            f"--ep {ep}: more ranks than the {routed} + {extra} {what}; allowed: 1..{routed + extra}"
        )
    return extra


def check_ep(ep: int, routed: int, extra: int, what: str) -> None:
    """An EP size must divide routed + redundant experts (the rounding guarantees it; a hand-set count may
    not)."""
    total = routed + extra
    if total % ep:
        ok = [d for d in range(1, total + 1) if total % d == 0]
        raise ValueError(
            f"--ep {ep} does not divide the {total} {what} (routed {routed} + redundant {extra}); "
            f"allowed: {ok}"
        )
