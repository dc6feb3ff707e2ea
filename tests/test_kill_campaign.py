"""kill -9 at random moments (one during a checkpoint write), restart: the final parameters,
optimizer state, RNG and data position equal an uninterrupted run's bit for bit
(benchmarks/kill_campaign.py with 2 kills; the benchmark itself runs 10). Both campaigns
share one work dir: the second reuses the first's reference run and compilation cache.

Slow tier (about 4 minutes of subprocesses): the fast tier keeps kill -9 and resume on gs://
(tests/test_storage.py) and SIGTERM / SIGINT saving and a bit-exact resume
(tests/test_modeldir.py)."""
import pytest

from benchmarks import kill_campaign


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("kill_campaign")


@pytest.mark.slow
def test_kill_restart_is_bitwise_equal_to_uninterrupted(work_dir):
  summary = kill_campaign.run_campaign(work_dir, kills=2, seed=0, steps=30)
  results = summary["results"]
  for r in results:
    assert r["killed"], r
    assert r["restart_ok"], r
    assert r["equal"], r  # "differences": the leaves that differ, with max_abs_diff
  assert summary["equal"] == 2
  assert summary["during_checkpoint_write"] >= 1, results
  # The restart that followed a kill during a write resumed from an older checkpoint.
  w = next(r for r in results if r["during_checkpoint_write"])
  assert w["resumed_from"] < min(w["tmp_dirs_left"])


@pytest.mark.slow
def test_sigterm_saves_and_the_restart_resumes_there_bitwise(work_dir):
  """The preemption campaign (benchmarks/kill_campaign.py --signal=SIGTERM, 4 signals: one
  before step 1, one at the final save, one in a checkpoint write, one in training):
  every signalled run exits 75 with one `preempted:` line saying what it saved (nothing
  before step 1); the restart resumes from exactly there and ends bit for bit as the
  uninterrupted run."""
  summary = kill_campaign.run_campaign(work_dir, kills=4, seed=1, steps=30, sig="SIGTERM")
  for r in summary["results"]:
    assert r["killed"] and r["restart_ok"] and r["equal"], r
    assert r["exit_code"] == 75 and r["preempt_ok"], r
  kinds = {r["kind"]: r for r in summary["results"]}
  assert kinds["start_up"]["preempt_saved"] in (0, 1)   # before step 1, or in its compile
  assert kinds["final_save"]["preempt_saved"] == 30
  assert summary["preempt_saved"] == 4 and summary["ok"]
