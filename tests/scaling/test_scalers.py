"""Tests of mxmp._src.scaling: the loss scaler values and their rules."""
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from mxnet.contrib.amp.amp import bfloat16

from mxmp._src.scaling import (DEFAULT_STATIC_SCALE, DynamicLossScaler, LossScaler,
    NoOpLossScaler, StaticLossScaler, make_loss_scaler)


def run(scaler, finites):
    for finite in finites:
        scaler = scaler.adjust(finite)
    return scaler


def test_dynamic_defaults_match_pytorch_gradscaler_and_contrib_amp():
    s = DynamicLossScaler()
    assert (s.scale, s.init_scale, s.growth_factor, s.backoff_factor, s.growth_interval,
            s.min_scale, s.max_scale, s.counter) == (2.**16, 2.**16, 2., .5, 2000, 1., 2.**24, 0)
    assert s.enabled and s.dynamic
    assert isinstance(s.scale, float)


def test_noop_and_static_flags():
    noop, static = NoOpLossScaler(), StaticLossScaler(128)
    assert (noop.scale, noop.enabled, noop.dynamic) == (1.0, False, False)
    assert (static.scale, static.enabled, static.dynamic) == (128.0, True, False)


def test_base_class_cannot_be_instantiated():
    with pytest.raises(TypeError, match='abstract'):
        LossScaler()


def test_dynamic_grows_after_exactly_growth_interval_finite_steps():
    s = DynamicLossScaler(init_scale=8., growth_interval=3)
    s = run(s, [True, True])
    assert (s.scale, s.counter) == (8., 2)
    s = s.adjust(True)
    assert (s.scale, s.counter) == (16., 0)
    s = run(s, [True, True])
    assert s.scale == 16.
    assert s.adjust(True).scale == 32.


def test_dynamic_backs_off_on_overflow_and_resets_the_counter():
    s = run(DynamicLossScaler(init_scale=8., growth_interval=3), [True, True])
    s = s.adjust(False)
    assert (s.scale, s.counter) == (4., 0)
    # the finite run must start again: two finite steps are not enough to grow
    s = run(s, [True, True])
    assert s.scale == 4.
    assert s.adjust(True).scale == 8.


def test_dynamic_scale_is_floored_at_min_scale_and_capped_at_max_scale():
    s = DynamicLossScaler(init_scale=4., min_scale=2., max_scale=16., growth_interval=1)
    assert run(s, [False] * 5).scale == 2.
    assert run(s, [True] * 5).scale == 16.
    capped = run(s, [True] * 5)
    assert capped.counter == 0


def test_custom_factors_are_used():
    s = DynamicLossScaler(init_scale=100., growth_factor=3., backoff_factor=.25,
                          growth_interval=1, min_scale=1., max_scale=1e4)
    assert s.adjust(True).scale == 300.
    assert s.adjust(False).scale == 25.


@pytest.mark.parametrize('scaler', [NoOpLossScaler(), StaticLossScaler(512.)])
def test_static_and_noop_scales_never_change(scaler):
    after = run(scaler, [True] * 10 + [False] * 10)
    assert after == scaler and after.scale == scaler.scale


def test_adjust_is_pure():
    s = DynamicLossScaler(init_scale=8., growth_interval=2)
    grown = s.adjust(True).adjust(True)
    backed_off = s.adjust(False)
    assert (s.scale, s.counter) == (8., 0)
    assert grown.scale == 16. and backed_off.scale == 4.
    assert grown is not s and backed_off is not s
    with pytest.raises(Exception):   # frozen dataclass: no attribute assignment
        s.scale = 1.


@pytest.mark.parametrize('scaler, fresh', [
    (NoOpLossScaler(), NoOpLossScaler()),
    (StaticLossScaler(1024.), StaticLossScaler(1024.)),
    (run(DynamicLossScaler(init_scale=2.**10, growth_interval=5), [True, True, False, True]),
     DynamicLossScaler(init_scale=2.**10, growth_interval=5)),
])
def test_state_dict_is_json_and_round_trips(scaler, fresh):
    d = json.loads(json.dumps(scaler.state_dict()))
    assert d['class'] == type(scaler).__name__
    restored = fresh.load_state_dict(d)
    assert restored == scaler
    assert restored.scale == scaler.scale


def test_load_state_dict_restores_scale_and_counter_without_mutating():
    saved = run(DynamicLossScaler(growth_interval=10), [False, True, True]).state_dict()
    fresh = DynamicLossScaler(growth_interval=10)
    restored = fresh.load_state_dict(saved)
    assert (restored.scale, restored.counter) == (2.**15, 2)
    assert (fresh.scale, fresh.counter) == (2.**16, 0)


def test_load_state_dict_rejects_another_class():
    with pytest.raises(ValueError, match="'StaticLossScaler'.*'DynamicLossScaler'"):
        DynamicLossScaler().load_state_dict(StaticLossScaler(8.).state_dict())


def test_load_state_dict_rejects_another_configuration_naming_the_field():
    saved = DynamicLossScaler(growth_interval=100).state_dict()
    with pytest.raises(ValueError, match='growth_interval'):
        DynamicLossScaler(growth_interval=2000).load_state_dict(saved)
    with pytest.raises(ValueError, match='scale'):
        StaticLossScaler(8.).load_state_dict(StaticLossScaler(16.).state_dict())


def test_load_state_dict_rejects_missing_keys_and_invalid_state():
    d = DynamicLossScaler().state_dict()
    del d['counter']
    with pytest.raises(ValueError, match='counter'):
        DynamicLossScaler().load_state_dict(d)
    d = DynamicLossScaler().state_dict()
    d['scale'] = 0.5   # below min_scale (above max_scale is a state contrib.amp's fields make)
    with pytest.raises(ValueError, match='scale'):
        DynamicLossScaler().load_state_dict(d)
    with pytest.raises(ValueError, match='dict'):
        DynamicLossScaler().load_state_dict('not a dict')


@pytest.mark.parametrize('kwargs, name', [
    (dict(init_scale=0.), 'init_scale'),
    (dict(init_scale=float('inf')), 'init_scale'),
    (dict(init_scale=2.**30), 'init_scale'),
    (dict(growth_factor=1.), 'growth_factor'),
    (dict(backoff_factor=1.), 'backoff_factor'),
    (dict(backoff_factor=0.), 'backoff_factor'),
    (dict(growth_interval=0), 'growth_interval'),
    (dict(growth_interval=2.5), 'growth_interval'),
    (dict(growth_interval=True), 'growth_interval'),
    (dict(min_scale=-1.), 'min_scale'),
    (dict(min_scale=4., max_scale=2., init_scale=3.), 'max_scale'),
    (dict(counter=-1), 'counter'),
    (dict(init_scale=4., min_scale=2., scale=1.), 'scale'),
    (dict(init_scale='big'), 'init_scale'),
])
def test_dynamic_rejects_invalid_arguments_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name):
        DynamicLossScaler(**kwargs)


@pytest.mark.parametrize('value', [0, -1., float('nan'), float('inf'), None])
def test_static_rejects_invalid_scale(value):
    with pytest.raises(ValueError, match='scale'):
        StaticLossScaler(value)


@pytest.mark.parametrize('spec, dtype, expected', [
    (None, 'float16', DynamicLossScaler()),
    ('auto', np.float16, DynamicLossScaler()),
    (None, 'bfloat16', NoOpLossScaler()),
    ('AUTO', bfloat16, NoOpLossScaler()),
    (None, 'float32', NoOpLossScaler()),
    ('dynamic', 'bfloat16', DynamicLossScaler()),
    (True, 'float32', DynamicLossScaler()),
    ('static', 'float16', StaticLossScaler(DEFAULT_STATIC_SCALE)),
    ('none', 'float16', NoOpLossScaler()),
    (False, 'float16', NoOpLossScaler()),
    (1024, 'float16', StaticLossScaler(1024.)),
    (0.5, 'bfloat16', StaticLossScaler(.5)),
])
def test_make_loss_scaler_choices(spec, dtype, expected):
    got = make_loss_scaler(spec, dtype)
    assert type(got) is type(expected) and got == expected


def test_make_loss_scaler_passes_instances_through_and_static_default_is_2_16():
    custom = DynamicLossScaler(growth_interval=7)
    assert make_loss_scaler(custom, 'bfloat16') is custom
    assert DEFAULT_STATIC_SCALE == 2.**16


@pytest.mark.parametrize('spec', ['dynamc', 0, -4., float('nan'), object(), [1]])
def test_make_loss_scaler_rejects_unknown_specs(spec):
    with pytest.raises(ValueError, match='loss_scaler'):
        make_loss_scaler(spec, 'float16')


def test_make_loss_scaler_rejects_unknown_target_dtype():
    with pytest.raises(ValueError, match='int8'):
        make_loss_scaler(None, 'int8')


@settings(max_examples=200, deadline=None)
@given(k=st.integers(min_value=0, max_value=24),
       interval=st.integers(min_value=1, max_value=4),
       finites=st.lists(st.booleans(), max_size=200))
def test_dynamic_scale_stays_in_bounds_and_is_init_times_power_of_two(k, interval, finites):
    s = DynamicLossScaler(init_scale=2.**k, growth_interval=interval)
    for finite in finites:
        s = s.adjust(finite)
        assert s.min_scale <= s.scale <= s.max_scale
        assert 0 <= s.counter < interval
        exponent = math.log2(s.scale / s.init_scale)
        assert exponent == int(exponent)
