"""The Kubernetes manifests in deploy/kubernetes against what the daemon reads.

No cluster: the manifests are loaded as YAML and checked for the invariants a
data-parallel run depends on, against the sources themselves (the environment
variables core/dist/world.cc reads, the flags server/main.cc defines), so that
a renamed variable or flag, a replica count changed without the world size, or
a headless Service that does not publish not-ready pods fails here rather than
as ranks that never meet. Each check is also run on broken copies of the
manifests, which it must reject.

PyYAML comes into the venv with transformers and accelerate (both need it).
"""

import copy
import os
import re
import unittest

import yaml

SOURCE_DIR = os.environ.get("MEMPROFD_SOURCE_DIR",
                            os.path.join(os.path.dirname(os.path.abspath(__file__)), "../.."))
K8S = os.path.join(SOURCE_DIR, "deploy", "kubernetes")

# Variables the daemon's process reads besides the launchers' (world.cc):
# LibTorch's OpenMP threads, and Gloo's interface between hosts
# (core/dist/process_group.cc).
RUNTIME_ENV = {"OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME"}
# What the Kubeflow training operator sets in PyTorchJob pods.
PYTORCHJOB_ENV = {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
POD_INDEX_FIELD = "metadata.labels['apps.kubernetes.io/pod-index']"


def read(path):
    with open(os.path.join(SOURCE_DIR, path)) as f:
        return f.read()


def world_env_names():
    """Every environment variable named in core/dist/world.cc: the quoted
    upper-case identifiers it passes to env() and its helpers."""
    return set(re.findall(r'"([A-Z][A-Z0-9_]*)"', read("core/dist/world.cc")))


def getenv_names():
    """The variables core/dist reads with getenv directly."""
    names = set()
    for name in sorted(os.listdir(os.path.join(SOURCE_DIR, "core/dist"))):
        if name.endswith(".cc"):
            names |= set(re.findall(r'getenv\("([A-Z][A-Z0-9_]*)"\)', read("core/dist/" + name)))
    return names


def daemon_flags():
    """The flags server/main.cc defines."""
    return set(re.findall(r"ABSL_FLAG\(\s*[\w:]+,\s*(\w+),", read("server/main.cc")))


def load(name):
    with open(os.path.join(K8S, name)) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def of_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def flag_values(container):
    """--name=value arguments as {name: value}; a bare --name is "true"."""
    flags = {}
    for arg in container.get("args", []):
        m = re.fullmatch(r"--([a-z_]+)(?:=(.*))?", arg)
        if m:
            flags[m.group(1)] = m.group(2) if m.group(2) is not None else "true"
    return flags


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_daemon_container(container, where):
    """Problems with a memprofd container: unknown flags, listen addresses the
    pod's IP cannot reach, container ports and probes that are not the ports
    the flags bind, variables the daemon does not read."""
    problems = []
    known = daemon_flags()
    flags = flag_values(container)
    for flag in flags:
        if flag not in known:
            problems.append("%s: --%s is not a memprofd flag" % (where, flag))
    for arg in container.get("args", []):
        if not arg.startswith("--"):
            problems.append("%s: argument %r is not a flag" % (where, arg))
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    for flag, port_name in (("listen", "grpc"), ("metrics_listen", "metrics")):
        if flag not in flags:
            problems.append("%s: no --%s (the image's default is not the manifest's)" % (where, flag))
            continue
        if not flags[flag].startswith("0.0.0.0:") and not flags[flag].startswith("[::]:"):
            problems.append("%s: --%s=%s is not reachable on the pod's IP" % (where, flag, flags[flag]))
        if ports.get(port_name) != port_of(flags[flag]):
            problems.append("%s: container port %s is %s but --%s binds %d"
                            % (where, port_name, ports.get(port_name), flag, port_of(flags[flag])))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        spec = container.get(probe)
        if spec is None:
            if probe != "livenessProbe":
                problems.append("%s: no %s" % (where, probe))
            continue
        if "grpc" not in spec or spec["grpc"].get("port") != ports.get("grpc"):
            problems.append("%s: %s is not gRPC health on the grpc port" % (where, probe))
    allowed = world_env_names() | getenv_names() | RUNTIME_ENV
    for name in env_of(container):
        if name not in allowed:
            problems.append("%s: memprofd does not read %s" % (where, name))
    return problems


def check_statefulset(docs):
    """Problems with a data-parallel StatefulSet manifest (see the module comment)."""
    problems = []
    sets = of_kind(docs, "StatefulSet")
    if len(sets) != 1:
        return ["%d StatefulSets, expected 1" % len(sets)]
    sts = sets[0]
    name, spec = sts["metadata"]["name"], sts["spec"]
    pod = spec["template"]
    pod_labels = pod["metadata"]["labels"]
    replicas = spec.get("replicas", 1)
    if spec.get("podManagementPolicy") != "Parallel":
        problems.append("podManagementPolicy is not Parallel: rank 1 would wait for rank 0 "
                        "to be Ready, which it is only once rank 1 has joined")
    if not selects(spec["selector"]["matchLabels"], pod_labels):
        problems.append("the StatefulSet's selector does not match its pods")

    services = {s["metadata"]["name"]: s for s in of_kind(docs, "Service")}
    headless = services.get(spec.get("serviceName"))
    if headless is None:
        return problems + ["no Service named serviceName %r" % spec.get("serviceName")]
    hspec = headless["spec"]
    if hspec.get("clusterIP") != "None":
        problems.append("Service %s is not headless (clusterIP: None)" % spec["serviceName"])
    if hspec.get("publishNotReadyAddresses") is not True:
        problems.append("Service %s does not publish not-ready addresses: pod 0's name "
                        "would not resolve before the rendezvous" % spec["serviceName"])
    if not selects(hspec.get("selector"), pod_labels):
        problems.append("Service %s does not select the StatefulSet's pods" % spec["serviceName"])

    containers = pod["spec"]["containers"]
    if len(containers) != 1:
        return problems + ["%d containers, expected memprofd alone" % len(containers)]
    c = containers[0]
    problems += check_daemon_container(c, "StatefulSet %s" % name)
    env = env_of(c)
    for other in ("RANK", "WORLD_SIZE", "PET_NNODES", "PET_NODE_RANK"):
        if other in env:
            problems.append("%s is set: memprofd would read torchrun's or Kubeflow's world "
                            "instead of the StatefulSet's" % other)
    world = env.get("MEMPROFD_WORLD_SIZE", {}).get("value")
    if world != str(replicas):
        problems.append("MEMPROFD_WORLD_SIZE is %r but replicas is %d" % (world, replicas))
    field = env.get("MEMPROFD_POD_INDEX", {}).get("valueFrom", {}).get("fieldRef", {})
    if field.get("fieldPath") != POD_INDEX_FIELD:
        problems.append("MEMPROFD_POD_INDEX is not the pod's %s" % POD_INDEX_FIELD)
    master = env.get("MASTER_ADDR", {}).get("value", "")
    if not re.fullmatch(re.escape("%s-0.%s" % (name, spec["serviceName"])) + r"(\..+)?", master):
        problems.append("MASTER_ADDR %r is not pod 0 through the headless Service (%s-0.%s)"
                        % (master, name, spec["serviceName"]))
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    master_port = env.get("MASTER_PORT", {}).get("value")
    if master_port is None or int(master_port) not in ports.values():
        problems.append("MASTER_PORT %r is not a port the container exposes" % master_port)
    elif not any(sp.get("targetPort") in (int(master_port), name_)
                 for sp in hspec.get("ports", [])
                 for name_, port in ports.items() if port == int(master_port)):
        problems.append("the headless Service does not carry MASTER_PORT %s" % master_port)
    for svc in services.values():
        for sp in svc["spec"].get("ports", []):
            target = sp.get("targetPort", sp["port"])
            if target not in ports and target not in ports.values():
                problems.append("Service %s targets port %r the container does not expose"
                                % (svc["metadata"]["name"], target))

    # Rank 0 serves the API: a Service for clients must select pod 0 alone.
    for svc_name, svc in services.items():
        if svc is headless:
            continue
        sel = svc["spec"].get("selector", {})
        if sel.get("statefulset.kubernetes.io/pod-name") != "%s-0" % name:
            problems.append("Service %s reaches ranks other than 0, which do not serve the API"
                            % svc_name)
    # Every rank scraped once: the monitor selects the headless Service alone.
    for monitor in of_kind(docs, "ServiceMonitor"):
        wanted = monitor["spec"]["selector"].get("matchLabels") or {}
        chosen = [n for n, s in services.items()  # an empty selector takes every one
                  if not wanted or selects(wanted, s["metadata"].get("labels", {}))]
        if chosen != [spec["serviceName"]]:
            problems.append("ServiceMonitor %s selects %s, not the headless Service alone"
                            % (monitor["metadata"]["name"], chosen))
        for ep in monitor["spec"]["endpoints"]:
            if ep["port"] not in {p["name"] for p in hspec.get("ports", [])}:
                problems.append("ServiceMonitor port %s is not on the headless Service" % ep["port"])
    return problems


def check_pytorchjob(docs):
    """Problems with a PyTorchJob manifest: what the training operator needs
    (a container named pytorch with a port named pytorchjob-port, a Master)
    and what memprofd then reads."""
    problems = []
    jobs = of_kind(docs, "PyTorchJob")
    if len(jobs) != 1:
        return ["%d PyTorchJobs, expected 1" % len(jobs)]
    job = jobs[0]
    if job.get("apiVersion") != "kubeflow.org/v1":
        problems.append("apiVersion %r is not kubeflow.org/v1" % job.get("apiVersion"))
    specs = job["spec"]["pytorchReplicaSpecs"]
    if set(specs) != {"Master", "Worker"}:
        problems.append("replica types %s, expected Master and Worker" % sorted(specs))
    if specs.get("Master", {}).get("replicas") != 1:
        problems.append("the Master (rank 0) must be one replica")
    if specs.get("Worker", {}).get("replicas", 0) < 1:
        problems.append("no Worker: a world of one rank is not data parallel")
    if not PYTORCHJOB_ENV <= world_env_names():
        problems.append("memprofd does not read every variable the operator sets: %s"
                        % sorted(PYTORCHJOB_ENV - world_env_names()))
    for rtype, rspec in specs.items():
        containers = {c["name"]: c for c in rspec["template"]["spec"]["containers"]}
        c = containers.get("pytorch")
        if c is None:
            problems.append("%s: no container named pytorch (the operator sets its variables "
                            "there)" % rtype)
            continue
        problems += check_daemon_container(c, "PyTorchJob %s" % rtype)
        ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
        if "pytorchjob-port" not in ports:
            problems.append("%s: no port named pytorchjob-port (the operator's MASTER_PORT)" % rtype)
        elif ports["pytorchjob-port"] in (ports.get("grpc"), ports.get("metrics")):
            problems.append("%s: the rendezvous port is the gRPC or metrics port" % rtype)
        for name in env_of(c):
            if name in PYTORCHJOB_ENV or name.startswith("PET_") or name.startswith("MEMPROFD_"):
                problems.append("%s: %s set by hand; the operator sets the world" % (rtype, name))
    return problems


class SourcesTest(unittest.TestCase):
    def test_the_sources_name_the_launchers_variables_and_the_flags(self):
        # What the checks compare against is really there (not an empty set
        # that every manifest would pass by accident of a regex).
        self.assertLessEqual({"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                              "MEMPROFD_WORLD_SIZE", "MEMPROFD_POD_INDEX", "HOSTNAME",
                              "PET_NNODES"}, world_env_names())
        self.assertIn("GLOO_SOCKET_IFNAME", getenv_names())
        self.assertLessEqual({"listen", "metrics_listen", "snapshot_root", "resume",
                              "collective_timeout_seconds"}, daemon_flags())


class StatefulSetTest(unittest.TestCase):
    def setUp(self):
        self.docs = load("memprofd-dp.yaml")

    def test_the_data_parallel_statefulset_holds_together(self):
        self.assertEqual(check_statefulset(self.docs), [])
        self.assertGreaterEqual(of_kind(self.docs, "StatefulSet")[0]["spec"]["replicas"], 2)

    def broken(self, change):
        docs = copy.deepcopy(self.docs)
        change({d["kind"] + "/" + d["metadata"]["name"]: d for d in docs})
        return check_statefulset(docs)

    def test_each_broken_invariant_is_caught(self):
        def container(m):
            return m["StatefulSet/memprofd-dp"]["spec"]["template"]["spec"]["containers"][0]

        def env(m, name):
            return env_of(container(m))[name]

        def set_replicas(m):
            m["StatefulSet/memprofd-dp"]["spec"]["replicas"] = 3

        def rename_headless(m):
            m["StatefulSet/memprofd-dp"]["spec"]["serviceName"] = "memprofd-dp-api"

        def no_publish(m):
            del m["Service/memprofd-dp"]["spec"]["publishNotReadyAddresses"]

        def cluster_ip(m):
            del m["Service/memprofd-dp"]["spec"]["clusterIP"]

        def ordered(m):
            del m["StatefulSet/memprofd-dp"]["spec"]["podManagementPolicy"]

        def master_elsewhere(m):
            env(m, "MASTER_ADDR")["value"] = "memprofd-dp-1.memprofd-dp"

        def master_port(m):
            env(m, "MASTER_PORT")["value"] = "29501"

        def grpc_port(m):
            container(m)["args"][0] = "--listen=0.0.0.0:50052"

        def loopback(m):
            container(m)["args"][1] = "--metrics_listen=127.0.0.1:9464"

        def unknown_flag(m):
            container(m)["args"].append("--world_size=2")

        def torchrun_env(m):
            container(m)["env"].append({"name": "RANK", "value": "0"})

        def unread_env(m):
            container(m)["env"].append({"name": "MEMPROFD_RANK", "value": "0"})

        def pod_name(m):
            env(m, "MEMPROFD_POD_INDEX")["valueFrom"]["fieldRef"]["fieldPath"] = "metadata.name"

        def api_to_all(m):
            del m["Service/memprofd-dp-api"]["spec"]["selector"]["statefulset.kubernetes.io/pod-name"]

        def monitor_both(m):
            m["ServiceMonitor/memprofd-dp"]["spec"]["selector"]["matchLabels"] = {}

        for change in (set_replicas, rename_headless, no_publish, cluster_ip, ordered,
                       master_elsewhere, master_port, grpc_port, loopback, unknown_flag,
                       torchrun_env, unread_env, pod_name, api_to_all, monitor_both):
            self.assertNotEqual(self.broken(change), [], change.__name__)


class PyTorchJobTest(unittest.TestCase):
    def setUp(self):
        self.docs = load("memprofd-pytorchjob.yaml")

    def test_the_pytorchjob_gives_memprofd_the_operators_world(self):
        self.assertEqual(check_pytorchjob(self.docs), [])

    def test_each_broken_invariant_is_caught(self):
        def worker(docs):
            return docs[0]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]

        def rename(docs):
            worker(docs)["name"] = "memprofd"

        def no_port(docs):
            worker(docs)["ports"] = [p for p in worker(docs)["ports"] if p["name"] != "pytorchjob-port"]

        def hand_rank(docs):
            worker(docs)["env"].append({"name": "RANK", "value": "1"})

        def two_masters(docs):
            docs[0]["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2

        def metrics_port(docs):
            worker(docs)["args"][1] = "--metrics_listen=0.0.0.0:9465"

        for change in (rename, no_port, hand_rank, two_masters, metrics_port):
            # The manifest shares one pod template (a YAML anchor): copy it
            # apart so a change to the Worker's leaves the Master's as it is.
            docs = copy.deepcopy(self.docs)
            specs = docs[0]["spec"]["pytorchReplicaSpecs"]
            specs["Worker"]["template"] = copy.deepcopy(specs["Worker"]["template"])
            change(docs)
            self.assertNotEqual(check_pytorchjob(docs), [], change.__name__)


class SingleRankManifestTest(unittest.TestCase):
    def test_the_single_rank_statefulset_runs_memprofd_as_its_flags_say(self):
        docs = load("memprofd.yaml")
        sts = of_kind(docs, "StatefulSet")[0]
        c = sts["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(check_daemon_container(c, "memprofd.yaml"), [])
        # One replica: no world size, so a single process.
        self.assertNotIn("MEMPROFD_WORLD_SIZE", env_of(c))
        self.assertEqual(sts["spec"]["replicas"], 1)


if __name__ == "__main__":
    unittest.main()
