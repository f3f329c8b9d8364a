"""The port a service without one of its own is given: below the kernel's ephemeral range, free now."""

from __future__ import annotations

import socket

import app_service
import pytest

from allocstack.common.errors import AllocstackError


def test_the_choices_lie_below_the_ephemeral_range_read_from_the_kernel(tmp_path):
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    assert app_service.port_choices(ranges) == range(16384, 32768)
    ranges.write_text("1500 2000\n")  # a center's narrow setting: never a privileged port
    assert app_service.port_choices(ranges) == range(1024, 1500)
    assert app_service.port_choices(tmp_path / "missing") == range(0)
    ranges.write_text("")
    assert app_service.port_choices(ranges) == range(0)


def test_a_service_without_a_port_gets_a_free_one_outside_the_ephemeral_range():
    choices = app_service.port_choices()
    ports = {app_service.take_port(0) for _ in range(20)}
    assert all(port in choices for port in ports), ports
    for port in ports:  # free: a server binds it
        with socket.socket() as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))


def test_where_every_choice_is_taken_the_kernel_chooses_and_a_taken_fixed_port_is_refused():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        port = app_service.take_port(0, choices=range(taken, taken + 1))
        assert port not in (0, taken)
        with pytest.raises(AllocstackError) as refused:
            app_service.take_port(taken)
    assert refused.value.diag == "prerequisite"
    assert f"port {taken} on 127.0.0.1 is already in use on this node" in str(refused.value)
