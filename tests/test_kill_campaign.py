"""kill -9 at random moments (one during a checkpoint write), restart: the final parameters,
optimizer state, RNG and data position equal an uninterrupted run's bit for bit
(benchmarks/kill_campaign.py with 3 kills; the benchmark itself runs 10)."""
from benchmarks import kill_campaign


def test_kill_restart_is_bitwise_equal_to_uninterrupted(tmp_path):
  summary = kill_campaign.run_campaign(tmp_path, kills=3, seed=0, steps=30)
  results = summary["results"]
  for r in results:
    assert r["killed"], r
    assert r["restart_ok"], r
    assert r["equal"], r  # "differences": the leaves that differ, with max_abs_diff
  assert summary["equal"] == 3
  assert summary["during_checkpoint_write"] >= 1, results
  # The restart that followed a kill during a write resumed from an older checkpoint.
  w = next(r for r in results if r["during_checkpoint_write"])
  assert w["resumed_from"] < min(w["tmp_dirs_left"])


def test_sigterm_saves_and_the_restart_resumes_there_bitwise(tmp_path):
  """The preemption campaign (benchmarks/kill_campaign.py --signal=SIGTERM, 3 signals):
  every signalled run saves at the next step boundary and exits 75; the restart resumes
  from exactly that step and ends bit for bit as the uninterrupted run."""
  summary = kill_campaign.run_campaign(tmp_path, kills=3, seed=1, steps=30,
                                                         sig="SIGTERM")
  for r in summary["results"]:
    assert r["killed"] and r["restart_ok"] and r["equal"], r
    assert r["exit_code"] == 75 and r["preempt_ok"], r
  assert summary["preempt_saved"] == 3 and summary["ok"]
