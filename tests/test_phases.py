"""A run's phases (vmx/training/phases.py): defaults filled in, step ranges, the phase of
a checkpoint's step, and a phased run's inconsistent settings refused naming them."""
import pytest

from vmx.data import pipeline
from vmx.errors import ConfigError
from vmx.training.phases import Phase, phase_index, resolve_phases


def _cfg(batch_size=8):
  return pipeline.DatasetConfig("unset", {"inputs": 8, "targets": 8}, batch_size)


def test_phases_fill_in_the_runs_defaults_and_their_step_ranges():
  model, own_model, tx, own_tx = object(), object(), object(), object()
  phases = resolve_phases([Phase("warmup", 3, _cfg()),
                           Phase("em", 5, _cfg(), model=own_model, optimizer=own_tx)],
                          model, None, tx, "lr", 8)
  assert [(p.start, p.end) for p in phases] == [(0, 3), (3, 8)]
  assert phases[0].model is model and phases[0].optimizer is tx
  assert phases[0].learning_rate == "lr"
  assert phases[1].model is own_model and phases[1].optimizer is own_tx
  # a checkpoint at step s belongs to the phase containing s, a phase's last step included
  assert [phase_index(phases, s) for s in (0, 1, 3, 4, 8)] == [0, 0, 0, 1, 1]
  one = resolve_phases(None, model, _cfg(), tx, None, 4)
  assert [(p.name, p.start, p.end) for p in one] == [("train", 0, 4)]


@pytest.mark.parametrize("phases,cfg,total,message", [
    (None, None, 4, r"train: set train_dataset_cfg \(or phases="),
    ([Phase("a", 4, _cfg())], _cfg(), 4, "both train_dataset_cfg and phases are set"),
    ([], None, 4, "expected a non-empty list of Phase"),
    ([Phase("a", 2, _cfg()), Phase("a", 2, _cfg())], None, 4,
     r"phase names \['a', 'a'\] repeat"),
    ([Phase("a", 2, _cfg()), Phase("b", 3, _cfg())], None, 4,
     r"total_steps=4 but the phases' steps add up to 5 \(a 2, b 3\)"),
])
def test_inconsistent_phases_are_refused_naming_the_setting(phases, cfg, total, message):
  with pytest.raises(ConfigError, match=message):
    resolve_phases(phases, object(), cfg, object(), None, total)


def test_a_phase_checks_its_own_settings():
  with pytest.raises(ConfigError, match=r"Phase\('a'\)\.steps = 0: expected a positive"):
    Phase("a", 0, _cfg())
  with pytest.raises(ConfigError, match=r"Phase\.name = '': expected a non-empty name"):
    Phase("", 3, _cfg())
