"""Starting one memprofd for a GPU run kit part: on free ports (its
--port_file), its output in WORK/memprofd.log. Standard library only."""
import json
import os
import signal
import subprocess
import sys
import time


def start(memprofd, work, flags, timeout=240):
    """memprofd with `flags`, listening on free loopback ports; returns the
    process, its gRPC address and its ports (port_file's JSON) once it serves. Exits the part, naming the
    log, when it stops or does not serve within `timeout` seconds."""
    port_file = os.path.join(work, "ports.json")
    if os.path.exists(port_file):
        os.remove(port_file)
    log = open(os.path.join(work, "memprofd.log"), "wb")
    daemon = subprocess.Popen(
        [memprofd, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
         "--port_file=" + port_file] + list(flags),
        stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + timeout
    while not os.path.exists(port_file):
        if daemon.poll() is not None or time.time() > deadline:
            daemon.kill()
            sys.exit("memprofd did not start (exit %s); see %s/memprofd.log" % (daemon.poll(), work))
        time.sleep(0.1)
    time.sleep(0.1)  # the file is written whole, but give its writer the moment
    ports = json.load(open(port_file))
    return daemon, "127.0.0.1:%d" % ports["grpc_port"], ports


def stop(daemon, timeout=60):
    """SIGTERM, then the exit status within `timeout` seconds (the daemon
    drains first), or "killed after N s" when it had to be killed."""
    daemon.send_signal(signal.SIGTERM)
    try:
        return daemon.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait()
        return "killed after %d s" % timeout
