"""The compiled tokenizer method (llmtrace-native's ``tokenizer_method``) on its own: how it binds,
which calls it takes itself and which it hands to the Python method, and that it never turns a
failure of llmtrace's into the host's. The tokenizer integrations' behaviour with it in place is
tested in test_tokenizers.py, once with each form."""

from __future__ import annotations

import contextvars
import functools
import gc
import inspect
import weakref
from typing import Any

import pytest

from llmtrace import _native

NATIVE = _native.load()
needs_native = pytest.mark.skipif(NATIVE is None, reason="llmtrace-native is not built (no Rust toolchain)")


class Observed:
    def __init__(self, recording: Any) -> None:
        self.recording = recording


class Broken:
    @property
    def recording(self) -> bool:
        raise RuntimeError("recording unreadable")


class Harness:
    """A class with one method replaced the way the integrations replace it; what reached the
    original and the Python fallback, and the flag each saw."""

    def __init__(self, observe: bool = True, fail: BaseException | None = None, times_requests: bool = False,
                 failed_raises: bool = False) -> None:
        self.flag: contextvars.ContextVar[bool] = contextvars.ContextVar("flag", default=False)
        self.request: contextvars.ContextVar[Any] = contextvars.ContextVar("request", default=None)
        self.scope: contextvars.ContextVar[Any] = contextvars.ContextVar("scope", default=None)
        self.original_calls: list[tuple[Any, tuple[Any, ...], dict[str, Any], bool]] = []
        self.fallback_calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
        self.timed_calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
        self.timed_flags: list[bool] = []  # whether the timing function's nested calls pass through
        self.failed_calls: list[tuple[Any, ...]] = []
        harness = self

        def decode(self: Any, ids: list[int], skip_special_tokens: bool = False) -> str:
            """The library's own decode."""
            harness.original_calls.append((self, (ids,), {"skip_special_tokens": skip_special_tokens},
                                           harness.passing()))
            if fail is not None:
                raise fail
            return " ".join(map(str, ids))

        def timed(self: Any, *args: Any, **kwargs: Any) -> str:
            harness.timed_calls.append((self, args, kwargs))
            harness.timed_flags.append(harness.passing())
            return "timed"

        def fallback(self: Any, *args: Any, **kwargs: Any) -> str:
            harness.fallback_calls.append((self, args, kwargs))
            return "fallback"

        def failed(*args: Any, **kwargs: Any) -> None:
            harness.failed_calls.append((*args, kwargs))
            if failed_raises:
                raise RuntimeError("llmtrace's own failure while reporting")

        self.original = decode
        self.method = NATIVE.tokenizer_method(decode, timed, fallback, self.flag,
                                              (self.request, self.scope) if observe else None,
                                              failed if times_requests else None)
        functools.update_wrapper(self.method, decode)
        self.cls: Any = type("Tokenizer", (), {"decode": self.method})

    def passing(self) -> bool:
        """Whether a nested call now would pass straight through: the flag given, or this thread's
        pass-through flag."""
        return self.flag.get() or bool(NATIVE.tokenizer_passing_through())


@needs_native
def test_binds_like_a_function_and_keeps_the_original_s_signature() -> None:
    """``instance.decode(...)`` gets the instance first; ``Class.decode`` is the method itself and
    callable with the instance; introspection follows ``__wrapped__`` to the original, bound or not."""
    harness = Harness()
    instance = harness.cls()
    assert harness.cls.decode is harness.method
    assert harness.method.__wrapped__ is harness.original
    assert harness.method.__name__ == "decode" and harness.method.__doc__ == "The library's own decode."
    assert inspect.signature(harness.cls.decode) == inspect.signature(harness.original)
    assert "(ids: 'list[int]', skip_special_tokens: 'bool' = False) -> 'str'" == str(inspect.signature(instance.decode))
    harness.request.set(Observed(False))
    bound = instance.decode  # an attribute read without a call: a bound method, as for a function
    assert bound.__self__ is instance and bound([4]) == "4"
    assert instance.decode([1, 2], skip_special_tokens=True) == "1 2"
    assert harness.cls.decode(instance, [3]) == "3"
    assert [(instance, ([4],), {"skip_special_tokens": False}), (instance, ([1, 2],), {"skip_special_tokens": True}),
            (instance, ([3],), {"skip_special_tokens": False})] == [call[:3] for call in harness.original_calls]


@needs_native
def test_a_method_in_a_reference_cycle_is_collected() -> None:
    """What it holds is released when it dies, through the cycle collector too (a method whose
    ``__dict__`` reaches itself, as ``functools.update_wrapper`` can make)."""
    harness = Harness()
    original = weakref.ref(harness.original)
    harness.method.itself = harness.method
    del harness
    gc.collect()
    assert original() is None


@needs_native
def test_an_unobserved_call_passes_through_with_the_flag_set_around_it() -> None:
    """An unsampled request current (or, with none, an unsampled server scope): the original runs
    at once, its nested calls see the flag, and the flag is back to false afterwards."""
    for var in ("request", "scope"):
        harness = Harness()
        getattr(harness, var).set(Observed(False))
        assert harness.cls().decode([7]) == "7"
        assert [True] == [call[3] for call in harness.original_calls]
        assert [] == harness.fallback_calls == harness.timed_calls
        assert not harness.passing()


@needs_native
def test_calls_nested_in_a_passed_through_call_pass_through() -> None:
    """Inside an unobserved call, a nested call of any llmtrace tokenizer method goes to its
    original as it came — even one that would be timed on its own (an encode; a decode after the
    request became recording) — and the flag of an outer pass-through survives the inner one."""
    outer = Harness()
    inner = Harness(observe=False)  # an encode: every user-level call timed
    outer.request.set(Observed(False))
    seen: list[bool] = []

    def decode(self: Any, ids: list[int]) -> str:
        outer.request.set(Observed(True))
        nested = (inner.cls().decode(ids), self.decode_again(ids))
        seen.append(bool(NATIVE.tokenizer_passing_through()))
        return "|".join(nested)

    method = NATIVE.tokenizer_method(decode, outer.method, outer.method, outer.flag, (outer.request, outer.scope))
    cls: Any = type("Tokenizer", (), {"decode": method, "decode_again": outer.method})
    assert cls().decode([5]) == "5|5"
    assert [] == inner.timed_calls == outer.timed_calls == inner.fallback_calls == outer.fallback_calls
    assert [True] == seen and not NATIVE.tokenizer_passing_through()


@needs_native
def test_an_observed_call_is_timed() -> None:
    """A sampled request current (even inside an unsampled call), a sampled call with no request
    current, or a method whose every user-level call is timed (an encode): the timing function
    gets the call as it came, with the pass-through flag set around it (and reset after)."""
    cases = [Harness(), Harness(), Harness(observe=False)]
    cases[0].scope.set(Observed(False))
    cases[0].request.set(Observed(True))
    cases[1].scope.set(Observed(True))
    cases[2].request.set(Observed(False))
    for harness in cases:
        instance = harness.cls()
        assert instance.decode([7], skip_special_tokens=True) == "timed"
        assert [(instance, ([7],), {"skip_special_tokens": True})] == harness.timed_calls
        assert [] == harness.original_calls and [] == harness.fallback_calls
        assert [True] == harness.timed_flags and not harness.passing()


@needs_native
def test_a_nested_call_passes_through_untouched() -> None:
    """The flag set (an outer tokenizer call llmtrace handles): the original, never the fallback,
    even for a method that times every call."""
    harness = Harness(observe=False)
    harness.flag.set(True)
    assert harness.cls().decode([1]) == "1"
    assert [] == harness.fallback_calls == harness.timed_calls


@needs_native
def test_the_python_method_decides_what_the_compiled_one_cannot() -> None:
    """No request or scope current, or a `recording` that cannot be read: the Python method gets
    the call as it came, and no error of reading leaks into the host's call."""
    cases = [Harness(), Harness()]
    cases[1].request.set(Broken())
    for harness in cases:
        instance = harness.cls()
        assert instance.decode([1], skip_special_tokens=True) == "fallback"
        assert [(instance, ([1],), {"skip_special_tokens": True})] == harness.fallback_calls
        assert [] == harness.original_calls and [] == harness.timed_calls


class Interrupted(BaseException):
    """Not an Exception (as KeyboardInterrupt, or pyo3's PanicException from a Rust tokenizer)."""


class Request(Observed):
    """A request record as the compiled decode reads and writes it."""

    def __init__(self, recording: bool, finish_ns: int | None = None) -> None:
        super().__init__(recording)
        self.detokenize_ns = 5
        self.finish_ns = finish_ns


class Scope(Observed):
    """A server scope as the compiled decode reads it."""

    def __init__(self, handles: list[Request], deferred: dict[int, Any] | None = None) -> None:
        super().__init__(True)
        self.handles = handles
        self.deferred = deferred or {}


@needs_native
def test_a_decode_of_a_recording_request_is_timed_in_place() -> None:
    """A method made with `failed` (the decodes): a call whose current request records runs the
    original with the pass-through flag set around it and adds its duration to the request's
    `detokenize_ns`, without the timing function; with no request current, a recording scope's
    call still goes to the timing function, and an unrecorded request's passes through untimed."""
    harness = Harness(times_requests=True)
    request = Request(True)
    harness.request.set(request)
    instance = harness.cls()
    assert instance.decode([7, 8], skip_special_tokens=True) == "7 8"
    assert [(instance, ([7, 8],), {"skip_special_tokens": True}, True)] == harness.original_calls
    assert [] == harness.timed_calls == harness.fallback_calls == harness.failed_calls
    assert request.detokenize_ns > 5 and not harness.passing()

    idle = Request(False)
    harness.request.set(idle)
    assert instance.decode([1]) == "1" and idle.detokenize_ns == 5 and [] == harness.timed_calls

    harness.request.set(None)
    harness.scope.set(Observed(True))  # not a scope it can read: the timing function decides
    assert instance.decode([1]) == "timed" and len(harness.timed_calls) == 1


@needs_native
def test_a_streamed_decode_in_a_recording_scope_is_timed_on_its_last_open_request() -> None:
    """No request current and the server scope records: the duration goes to the scope's last open
    request; where the scope defers a request's end, or has no open request, the timing function
    decides (as `_decode_reporting` does)."""
    harness = Harness(times_requests=True)
    streaming, earlier, done = Request(False), Request(True), Request(True, finish_ns=1)
    harness.scope.set(Scope([earlier, streaming, done]))
    instance = harness.cls()
    assert instance.decode([4]) == "4"
    assert streaming.detokenize_ns > 5 and earlier.detokenize_ns == done.detokenize_ns == 5
    assert [] == harness.timed_calls and not harness.passing()
    for scope in (Scope([streaming], deferred={id(streaming): object()}), Scope([done]), Scope([])):
        harness.scope.set(scope)
        assert instance.decode([4]) == "timed"
    assert 3 == len(harness.timed_calls)


@needs_native
def test_a_scope_whose_requests_change_while_read_is_read_safely() -> None:
    """A request whose `finish_ns` is code that empties the scope's list while the compiled method
    walks it: no request of the emptied list is read, and the timing function decides."""
    harness = Harness(times_requests=True)
    handles: list[Request] = []

    class Shrinking(Request):
        @property
        def finish_ns(self) -> int:
            handles.clear()
            return 1

        @finish_ns.setter
        def finish_ns(self, value: int | None) -> None:
            pass

    handles.extend([Request(True), Request(True), Shrinking(True)])
    harness.scope.set(Scope(handles))
    assert harness.cls().decode([4]) == "timed" and [] == handles


@needs_native
@pytest.mark.parametrize("failed_raises", [False, True])
def test_a_failed_decode_timed_in_place_is_reported_and_reraised(failed_raises: bool) -> None:
    """The tokenizer's exception reaches the caller as it came (the same object, its traceback),
    after `failed(elapsed_ns, exception, instance, *args, **kwargs)` reported it — even when
    reporting fails; an interrupt is not reported; the request's total is not added to."""
    error = ValueError("bad ids")
    harness = Harness(fail=error, times_requests=True, failed_raises=failed_raises)
    request = Request(True)
    harness.request.set(request)
    instance = harness.cls()
    with pytest.raises(ValueError) as raised:
        instance.decode([3], skip_special_tokens=False)
    assert raised.value is error and raised.traceback[-1].name == "decode"
    (elapsed, reported, tokenizer, ids, kwargs), = harness.failed_calls
    assert elapsed >= 0 and reported is error and tokenizer is instance and [3] == ids
    assert {"skip_special_tokens": False} == kwargs
    assert request.detokenize_ns == 5 and not harness.passing()

    interrupted = Harness(fail=Interrupted("stop"), times_requests=True)
    interrupted.request.set(Request(True))
    with pytest.raises(Interrupted):
        interrupted.cls().decode([3])
    assert [] == interrupted.failed_calls and not interrupted.passing()


@needs_native
def test_failed_needs_observe() -> None:
    """`failed` times a recording request's calls: a method that times every call cannot take it."""
    with pytest.raises(TypeError, match="failed"):
        NATIVE.tokenizer_method(len, len, len, contextvars.ContextVar("flag"), None, len)


@needs_native
def test_the_original_s_exception_reaches_the_caller_and_the_flag_is_reset() -> None:
    """The tokenizer's own exception, the same object with its traceback, whatever its class."""
    for error in (ValueError("bad ids"), Interrupted("stop")):
        harness = Harness(fail=error)
        harness.request.set(Observed(False))
        with pytest.raises(type(error)) as raised:
            harness.cls().decode([1])
        assert raised.value is error and raised.traceback[-1].name == "decode"
        assert not harness.passing()
        assert [True] == [call[3] for call in harness.original_calls]


@pytest.mark.parametrize("form", ["native", "python"])
def test_an_interrupt_resets_the_flag_and_is_not_reported(form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A timed call interrupted by a BaseException: the exception reaches the caller, the flag is
    reset (later calls in this context are timed again), and nothing is reported as the call's
    failure."""
    from llmtrace.integrations import _common

    if form == "native" and NATIVE is None:
        pytest.skip("llmtrace-native is not built: the compiled tokenizer methods are not in use")
    monkeypatch.setenv("LLMTRACE_NATIVE_TOKENIZER", form)
    reported: list[Any] = []

    def original(self: Any, text: str) -> list[int]:
        if text == "stop":
            raise Interrupted(text)
        return [1, 2]

    method = _common._timed_tokenizer_method(lambda *args: reported.append(args))(original)
    tokenizer: Any = type("Tokenizer", (), {"encode": method})()
    with pytest.raises(Interrupted):
        tokenizer.encode("stop")
    assert not _common.tokenizer_busy()
    assert [] == reported
    assert [1, 2] == tokenizer.encode("go")
    assert [[1, 2]] == [args[4] for args in reported]  # timed and reported: the flag was reset
