"""save_hyperparameters() called in a parent's __init__, for a Task and a DataModule: what hparams holds.
Run under Tandem by tests/test_task.py and, with its imports rewritten, under Lightning by its slow test.

``python hparams_chain.py`` prints one JSON line: {case: hparams}.
"""

from __future__ import annotations

import json

from trainer import DataModule, Task


class Parent(Task):
    def __init__(self, lr=0.1, hidden=8, _private=1):
        super().__init__()
        self.save_hyperparameters()


class Child(Parent):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)


class ChildWithArgs(Parent):
    def __init__(self, dropout=0.5, *args, **kwargs):
        super().__init__(*args, **kwargs)


class Renaming(Parent):
    def __init__(self, width=4, depth=2):
        super().__init__(hidden=width * depth)


class Grandchild(Renaming):
    def __init__(self, width=3, name="g", **kwargs):
        super().__init__(width=width, **kwargs)


class Ignoring(Task):
    def __init__(self, lr=0.1, backbone=None):
        super().__init__()
        self.save_hyperparameters(ignore=["backbone"])


class IgnoringChild(Ignoring):
    def __init__(self, momentum=0.9, backbone="net"):
        super().__init__(backbone=backbone)


class DataParent(DataModule):
    def __init__(self, batch_size=32, root="data"):
        super().__init__()
        self.save_hyperparameters()


class DataChild(DataParent):
    def __init__(self, workers=2, batch_size=16):
        super().__init__(batch_size=batch_size)


def cases() -> dict[str, dict]:
    return {
        "child": dict(Child(hidden=4).hparams),
        "child_with_args": dict(ChildWithArgs(0.2, 0.3).hparams),
        "renaming": dict(Renaming(width=5).hparams),
        "grandchild": dict(Grandchild(depth=3).hparams),
        "ignoring_child": dict(IgnoringChild().hparams),
        "datamodule_child": dict(DataChild(workers=4).hparams),
        "parent": dict(Parent(lr=0.5).hparams),
    }


if __name__ == "__main__":
    print("RESULT " + json.dumps(cases(), sort_keys=True))
