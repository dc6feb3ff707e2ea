"""The evaluation launcher's task settings (launch/eval.py, vmx/evaluation/evaluators.py):
every task's settings are its evaluator's fields, set as --TASK.FIELD=VALUE; the flags of
earlier releases set the same fields, with one warning; bad settings are one error naming
the flag."""
import importlib.util
from pathlib import Path

import pytest

from vmx.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def _launcher():
  spec = importlib.util.spec_from_file_location("vmx_eval_settings", REPO / "launch" / "eval.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture
def model_dir(tmp_path):
  (tmp_path / "vmx_model.json").write_text("{}")
  return tmp_path


def _settings(model_dir, *argv):
  _, settings, tasks = _launcher().parse_args([f"--checkpoint_dir={model_dir}", *argv])
  return settings, tasks


def test_a_tasks_settings_are_its_evaluators_fields(model_dir):
  s, tasks = _settings(model_dir, "--tasks=tatoeba,dev,geometry,tatoeba_vector",
                       "--tatoeba.languages=deu,fra", "--dev.max_sentences", "none",
                       "--geometry.n=50", f"--geometry.files=de={model_dir / 'vmx_model.json'}",
                       "--tatoeba_vector.vector=8,first", "--mldoc.seeds=3,4")
  assert tasks == ["tatoeba", "dev", "geometry", "tatoeba_vector"]
  assert s["tatoeba"].languages == ["deu", "fra"] and s["dev"].max_sentences is None
  assert s["geometry"].n == 50 and s["tatoeba_vector"].vector == (8, "first")
  assert s["mldoc"].seeds == [3, 4] and s["mldoc"].probe == "mlp"
  assert s["geometry"].files == {"de": str(model_dir / "vmx_model.json")}
  assert _settings(model_dir, "--languages=deu")[0]["tatoeba_vector"].languages == ["deu"]


def test_the_flags_of_earlier_releases_set_the_same_settings_with_one_warning(model_dir,
                                                                             capsys):
  old = _settings(model_dir, "--bucc_pairs=de-en", "--dev_max_sentences=0",
                  "--transfer_probe=mlp", "--transfer_seeds=1,2", "--tatoeba_layers=all",
                  "--tatoeba_layer_languages=deu", "--paracrawl_queries=7",
                  f"--retrieval_dir={model_dir}", f"--retrieval_dir={model_dir}")[0]
  err = capsys.readouterr().err
  assert "--bucc_pairs is deprecated and goes in vmx 0.2.0: use --bucc.pairs" in err
  assert err.count("--retrieval_dir is deprecated") == 1
  new = _settings(model_dir, "--bucc.pairs=de-en", "--dev.max_sentences=none",
                  "--xnli_transfer.probe=mlp", "--mldoc.probe=mlp", "--amazon_v1.probe=mlp",
                  "--amazon_v2.probe=mlp", "--xnli_transfer.seeds=1,2", "--mldoc.seeds=1,2",
                  "--amazon_v1.seeds=1,2", "--amazon_v2.seeds=1,2",
                  "--tatoeba_layers.layers=all", "--tatoeba_layers.languages=deu",
                  "--paracrawl.queries=7", f"--retrieval.dirs={model_dir},{model_dir}")[0]
  assert old == new


@pytest.mark.parametrize("argv,message", [
    (["--tatoeba.nope=1"], r"--tatoeba.nope: task tatoeba has no setting 'nope'; its "
                           r"settings: languages, english"),
    (["--geometry.n=many"], r"--geometry.n='many': expected int"),
    (["--xnli_transfer.probe=svm"], r"--xnli_transfer.probe='svm': expected one of logistic"),
    (["--tatoeba_vector=seven"], r"--tatoeba_vector='seven': expected LAYER,POOLING"),
    (["--sts17.dir=/no/such/dir"], r"--sts17.dir=/no/such/dir: no such file or directory"),
])
def test_a_bad_setting_is_one_error_naming_the_flag(model_dir, argv, message):
  with pytest.raises(ConfigError, match=message):
    _settings(model_dir, *argv)


def test_an_unknown_task_is_a_usage_error(model_dir, capsys):
  with pytest.raises(SystemExit) as e:
    _settings(model_dir, "--tatoba.languages=deu")
  assert e.value.code == 2
  assert "unrecognized argument '--tatoba.languages=deu' (a task setting is " in \
      capsys.readouterr().err
