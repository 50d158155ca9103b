"""strategies/fault_tolerance/options.py and the option on the strategies: FaultTolerance's values, what the
environment fills in, what ddp and fsdp refuse with it, and the option from a YAML config (the trust rules)."""

from __future__ import annotations

import pytest

from strategies import DDPStrategy, FaultTolerance, FSDPStrategy
from strategies.fault_tolerance.options import lighthouse_host_port
from tandem_core.errors import ConfigError
from trainer.config import build

ENV = (
    "TANDEM_REPLICA_GROUP",
    "TANDEM_REPLICA_GROUPS",
    "TORCHFT_LIGHTHOUSE",
    "SLURM_JOB_ID",
    "SLURM_NODEID",
    "SLURM_NNODES",
)


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for var in ENV:
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"min_replicas": 0}, r"min_replicas=0\): pass an int >= 1"),
        ({"min_replicas": True}, r"min_replicas=True\)"),
        ({"replica_groups": 0}, "at least one replica group"),
        ({"replica_group": -1}, r"replica_group=-1\): pass a non-negative int"),
        ({"timeout_s": 0}, r"timeout_s=0\): pass a positive number of seconds"),
        ({"quorum_timeout_s": "60"}, r"quorum_timeout_s='60'\)"),
        ({"max_uncommitted_steps": 0}, r"max_uncommitted_steps=0\)"),
        ({"lighthouse": "10.0.0.1"}, r"not of the form http://HOST:PORT"),
        ({"lighthouse": "https://10.0.0.1:29510"}, r"not of the form http://HOST:PORT"),
    ],
)
def test_bad_values_are_config_errors_naming_the_field(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        FaultTolerance(**kwargs)


def test_the_environment_fills_in_the_group_the_count_and_the_lighthouse(monkeypatch):
    monkeypatch.setenv("TANDEM_REPLICA_GROUP", "1")
    monkeypatch.setenv("TANDEM_REPLICA_GROUPS", "3")
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", "http://127.0.0.1:29510")
    r = FaultTolerance(min_replicas=2).resolved()
    assert (r.replica_group, r.replica_groups, r.lighthouse) == (1, 3, "http://127.0.0.1:29510")
    assert r.address == "127.0.0.1"  # the route to the lighthouse's host
    assert r.replica_id.endswith("1") and r.replica_id[-2] == "_"  # torchft numbers ranks from its digits
    given = FaultTolerance(
        replica_groups=2, replica_group=0, lighthouse="http://127.0.0.1:1", address="10.9.8.7"
    )
    assert given.resolved().address == "10.9.8.7" and given.resolved().replica_group == 0


def test_under_slurm_each_node_is_a_replica_group_by_default(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_NODEID", "2")
    monkeypatch.setenv("SLURM_NNODES", "4")
    r = FaultTolerance(lighthouse="http://127.0.0.1:1").resolved()
    assert (r.replica_group, r.replica_groups) == (2, 4)
    monkeypatch.setenv("TANDEM_REPLICA_GROUP", "0")  # the explicit variable wins
    assert FaultTolerance(lighthouse="http://127.0.0.1:1").resolved().replica_group == 0


@pytest.mark.parametrize(
    "kwargs, env, message",
    [
        ({}, {"TANDEM_REPLICA_GROUP": "0", "TORCHFT_LIGHTHOUSE": "http://h:1"}, "replica_groups.*TANDEM_REPLICA_GROUPS"),
        ({"replica_groups": 2}, {"TORCHFT_LIGHTHOUSE": "http://h:1"}, "replica_group.*TANDEM_REPLICA_GROUP \\(it is unset"),
        ({"replica_groups": 2}, {"TANDEM_REPLICA_GROUP": "x"}, "it is 'x'"),
        ({"replica_groups": 2, "replica_group": 2}, {}, "replica group 2 does not exist.*0..1"),
        ({"replica_groups": 2, "replica_group": 0, "min_replicas": 3}, {}, "min_replicas=3.*exceeds replica_groups=2"),
        ({"replica_groups": 2, "replica_group": 0}, {}, "lighthouse's address.*tandem lighthouse --bind"),
    ],
)  # fmt: skip
def test_what_is_missing_is_named(monkeypatch, kwargs, env, message):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError, match=message):
        FaultTolerance(**kwargs).resolved()


def test_lighthouse_addresses():
    assert lighthouse_host_port("http://10.0.0.1:29510") == ("10.0.0.1", 29510)
    assert lighthouse_host_port("10.0.0.1:29510") == ("10.0.0.1", 29510)
    assert lighthouse_host_port("http://[::1]:7") == ("::1", 7)


@pytest.mark.parametrize(
    "kwargs, what",
    [({"zero": 1}, "zero=1"), ({"bucket_cap_mb": "auto"}, "bucket_cap_mb='auto'"),
     ({"find_unused_parameters": True}, "find_unused_parameters=True")],
)  # fmt: skip
def test_ddp_refuses_what_would_make_groups_average_differently(kwargs, what):
    with pytest.raises(ConfigError, match=f"does not support {what}"):
        DDPStrategy(fault_tolerance=FaultTolerance(), **kwargs)


def test_fsdp_takes_the_option_and_refuses_hybrid():
    assert FSDPStrategy(fault_tolerance={"min_replicas": 1}).replicas is not None
    with pytest.raises(ConfigError, match="drop hybrid=True"):
        FSDPStrategy(hybrid=True, fault_tolerance=FaultTolerance())
    assert DDPStrategy().replicas is None and FSDPStrategy().replicas is None


def test_a_mapping_is_taken_and_unknown_keys_are_named():
    ft = DDPStrategy(fault_tolerance={"replica_groups": 2, "min_replicas": 1}).fault_tolerance
    assert ft == FaultTolerance(replica_groups=2, min_replicas=1)
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['min_replica'\]"):
        DDPStrategy(fault_tolerance={"min_replica": 1})
    with pytest.raises(ConfigError, match="pass FaultTolerance"):
        DDPStrategy(fault_tolerance=2)  # type: ignore[arg-type]


YAML = """
trainer:
  strategy:
    _target_: strategies.DDPStrategy
    fault_tolerance:
      {target}
      replica_groups: 2
      min_replicas: {min_replicas}
      lighthouse: http://10.0.0.1:29510
  devices: 1
  max_epochs: 1
"""


@pytest.mark.parametrize("target", ["", "_target_: strategies.FaultTolerance"])
def test_from_a_yaml_config(tmp_path, target):
    path = tmp_path / "ft.yaml"
    path.write_text(YAML.format(target=target, min_replicas=1))
    ft = build(str(path), with_task=False).trainer.strategy.fault_tolerance
    assert ft == FaultTolerance(replica_groups=2, min_replicas=1, lighthouse="http://10.0.0.1:29510")
    path.write_text(YAML.format(target=target, min_replicas="'one'"))
    with pytest.raises(ConfigError, match="min_replicas='one'"):
        build(str(path), with_task=False)


def test_a_config_calls_no_function_through_the_option(tmp_path):
    path = tmp_path / "ft.yaml"
    path.write_text(YAML.format(target="_target_: os.system", min_replicas=1))
    with pytest.raises(ConfigError, match="calls no functions"):
        build(str(path), with_task=False)
