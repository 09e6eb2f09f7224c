"""stable-baselines3: a PPO policy after one forward with grad.

SB3 keeps the last action distribution on the policy (``policy.action_dist.distribution =
Categorical(logits=...)``), so a single ``policy(obs)`` makes it non-deep-copyable natively:
the Categorical's ``logits`` and its lazily cached ``probs`` are non-leaf.  Copies of the
policy (a target network, a snapshot of the whole algorithm) are what users make.

``Categorical.__init__`` stores its logits twice, as ``logits`` and as ``_param`` (the same
tensor).  The copy meets it first as ``logits``, the first key of the distribution's
``__dict__``, and that is the name reported.
"""

from __future__ import annotations

import copy

import pytest

sb3 = pytest.importorskip("stable_baselines3")
gym = pytest.importorskip("gymnasium")

import torch  # noqa: E402
from ecosystem_support import assert_detached_twin, assert_independent_copy, assert_reports  # noqa: E402
from stable_baselines3.common.utils import polyak_update  # noqa: E402

import deepcopy_shim  # noqa: E402

EXPECTED = ("action_dist.distribution.logits", "action_dist.distribution.probs")


@pytest.fixture(scope="module")
def ppo():
    torch.manual_seed(0)
    env = gym.make("CartPole-v1")
    algo = sb3.PPO("MlpPolicy", env, n_steps=32, batch_size=16, n_epochs=1, seed=0, device="cpu",
                   policy_kwargs=dict(net_arch=[16]), verbose=0)
    obs = torch.as_tensor(env.reset(seed=0)[0]).unsqueeze(0)
    yield algo, obs
    env.close()


def after_forward(ppo):
    algo, obs = ppo
    actions, _, _ = algo.policy(obs)  # grad enabled: the stored distribution is non-leaf
    distribution = algo.policy.action_dist.distribution
    assert not distribution.logits.is_leaf and not distribution.probs.is_leaf
    return algo.policy, obs, actions


def test_ppo_policy_after_forward(ppo):
    policy, obs, actions = after_forward(ppo)
    reports = assert_reports(lambda: policy, lambda p: copy.deepcopy(p), EXPECTED, fresh=False,
                             copied_root=lambda p, result: result)
    assert reports.found is not None and [t for _, t in reports.found] == reports.met
    for mode in ("warn", "silent"):
        copied = reports.results[mode]
        distribution = copied.action_dist.distribution
        assert distribution.logits is distribution._param  # the alias is kept in the copy
        assert_independent_copy(policy, copied, lambda p: p.evaluate_actions(obs, actions)[1])


def test_ppo_policy_paths_spell_logits(ppo):
    policy, _, _ = after_forward(ppo)
    assert_reports(lambda: policy, lambda p: copy.deepcopy(p), EXPECTED, fresh=False)


def test_target_network_copy_stays_independent(ppo):
    policy, obs, actions = after_forward(ppo)
    logits = policy.action_dist.distribution.logits
    with deepcopy_shim.enabled("silent"):
        target = copy.deepcopy(policy)
    assert_detached_twin(logits, target.action_dist.distribution.logits)
    # Soft updates move the target towards the policy; it never shares storage with it.
    with torch.no_grad():
        polyak_update(policy.parameters(), target.parameters(), tau=1.0)
    for p, q in zip(policy.parameters(), target.parameters()):
        assert torch.equal(p, q) and p.untyped_storage().data_ptr() != q.untyped_storage().data_ptr()
    assert_independent_copy(policy, target, lambda p: p.evaluate_actions(obs, actions)[1])
    # (the step above trained the target: the outputs differ now)
    assert_independent_copy(target, policy, lambda p: p.evaluate_actions(obs, actions)[1], same_outputs=False)


def test_whole_algorithm_after_learn(ppo):
    algo, _ = ppo
    algo.learn(total_timesteps=32)
    after_forward(ppo)
    reports = assert_reports(lambda: algo, lambda a: copy.deepcopy(a), tuple(f"policy.{p}" for p in EXPECTED),
                             fresh=False, copied_root=lambda a, result: result)
    copied = reports.results["warn"]
    assert type(copied) is type(algo) and copied.policy is not algo.policy
    assert copied.policy.optimizer.param_groups[0]["params"][0] is next(copied.policy.parameters())
