"""InfoNCE against a NumPy reference."""
import jax.numpy as jnp
import numpy as np
import pytest

from vmx import losses


def _np_logsoftmax(x, axis):
  x = x - x.max(axis=axis, keepdims=True)
  return x - np.log(np.exp(x).sum(axis=axis, keepdims=True))


def np_infonce(a, b, t, bidirectional):
  a = a / np.linalg.norm(a, axis=1, keepdims=True)
  b = b / np.linalg.norm(b, axis=1, keepdims=True)
  s = a @ b.T / t
  i = np.arange(len(a))
  fwd = -_np_logsoftmax(s, 1)[i, i].mean()
  if not bidirectional:
    return fwd
  return 0.5 * (fwd - _np_logsoftmax(s, 0)[i, i].mean())


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("temperature", [0.05, 1.0])
def test_in_batch_softmax_matches_numpy(bidirectional, temperature):
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(7, 5)), rng.normal(size=(7, 5))
  loss, metrics = losses.in_batch_softmax_loss(jnp.asarray(a), jnp.asarray(b), temperature,
                                               bidirectional)
  np.testing.assert_allclose(float(loss), np_infonce(a, b, temperature, bidirectional),
                             rtol=1e-5)
  assert float(metrics["loss"]) == float(loss)


def test_perfect_alignment_has_low_loss_and_full_accuracy():
  x = jnp.eye(6) * 3.0
  loss, m = losses.in_batch_softmax_loss(x, x, 0.05)
  assert float(loss) < 1e-3 and float(m["in_batch_accuracy"]) == 1.0


def test_loss_is_asymmetric_unless_bidirectional():
  rng = np.random.default_rng(1)
  a, b = jnp.asarray(rng.normal(size=(5, 4))), jnp.asarray(rng.normal(size=(5, 4)))
  l_ab, _ = losses.in_batch_softmax_loss(a, b, 0.1, bidirectional=True)
  l_ba, _ = losses.in_batch_softmax_loss(b, a, 0.1, bidirectional=True)
  np.testing.assert_allclose(float(l_ab), float(l_ba), rtol=1e-6)
