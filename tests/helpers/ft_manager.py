"""The part of torchft's Manager that a fake of it keeps as torchft does: its state (the count of committed steps
and of batches), saved and restored with the group's checkpoint. tests/test_ft_replicas.py and
tests/test_ft_join.py build their fake managers on it."""

from __future__ import annotations


class ManagerState:
    state: dict[str, int]

    def state_dict(self) -> dict[str, int]:
        return dict(self.state)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.state = dict(state)

    def shutdown(self) -> None:
        pass
