"""The engine's worker and gradient copy thread share SerialThread: items run one at a time in submission order, and
a thread that an exception ended says so through ``alive()`` (what the training thread's waits ask before they give
up on an event it would have set)."""

import threading

from mbridge_offload.runtime.serial_thread import LazySerialThread, SerialThread


def test_items_run_in_submission_order_after_start():
    seen, done = [], threading.Event()

    def handle(item):
        seen.append(item)
        if item == 49:
            done.set()

    thread = SerialThread(name="test-serial", handle=handle, start=lambda: seen.append("start"))
    for item in range(50):
        thread.submit(item)
    assert done.wait(10)
    assert seen == ["start", *range(50)]
    assert thread.alive() and thread.thread.name == "test-serial" and thread.thread.daemon


def test_an_escaped_exception_ends_the_thread_and_alive_says_so():
    def handle(item):
        raise RuntimeError(item)

    thread = SerialThread(name="test-serial-fails", handle=handle)
    thread.submit("boom")
    thread.thread.join(10)
    assert not thread.alive()


def test_lazy_thread_starts_at_the_first_submit_and_forget_drops_it():
    made, handled = [], threading.Event()

    def make():
        made.append(1)
        return SerialThread(name="test-lazy", handle=lambda item: handled.set())

    lazy = LazySerialThread(make)
    assert not lazy.alive() and made == []  # no thread yet: a wait for it would never end
    lazy.submit("x")
    lazy.submit("y")
    assert handled.wait(10) and made == [1] and lazy.alive()
    lazy.forget()
    assert not lazy.alive()
