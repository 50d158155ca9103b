"""Lightning's small public enums and warning switch: LightningEnum (a case-insensitive str enum),
GradClipAlgorithmType, PossibleUserWarning and disable_possible_user_warnings."""

from __future__ import annotations

import warnings
from enum import Enum


class LightningEnum(str, Enum):
    """A str enum compared with strings case-insensitively; `from_str` finds a member by key or value."""

    @classmethod
    def from_str(cls, value: str, source: str = "key") -> LightningEnum:
        """The member whose key ("key"), value ("value") or either ("any") is `value`, in any case."""
        for key, member in cls.__members__.items():
            if source in ("key", "any") and key.lower() == value.lower():
                return member
            if source in ("value", "any") and str(member.value).lower() == value.lower():
                return member
        raise ValueError(f"Invalid match: expected one of {list(cls.__members__)}, but got {value}.")

    def __eq__(self, other: object) -> bool:
        other = other.value if isinstance(other, Enum) else str(other)
        return str(self.value).lower() == str(other).lower()

    def __hash__(self) -> int:
        return hash(str(self.value).lower())


class GradClipAlgorithmType(LightningEnum):
    """Trainer(gradient_clip_algorithm=...): "norm" clips the norm of all gradients together, "value" each one."""

    VALUE = "value"
    NORM = "norm"

    @staticmethod
    def supported_type(val: str) -> bool:
        """Whether `val` names an algorithm ("value" or "norm")."""
        return any(x.value == val for x in GradClipAlgorithmType)

    @staticmethod
    def supported_types() -> list[str]:
        return [x.value for x in GradClipAlgorithmType]


class PossibleUserWarning(UserWarning):
    """A warning that may be a false positive (Lightning's category of the same name)."""


def disable_possible_user_warnings(module: str = "") -> None:
    """Ignore PossibleUserWarning (from the modules matching `module`, or everywhere)."""
    warnings.filterwarnings("ignore", module=module, category=PossibleUserWarning)
