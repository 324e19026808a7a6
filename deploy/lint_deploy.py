#!/usr/bin/env python3
"""Static checks of deploy/ (run by deploy/lint.sh): the systemd units' TOML files, compose.yaml
(and its HAProxy config), the Dockerfile, and the Helm chart rendered by helm_render.py.
Each check is a cross-reference that, broken, makes the deployment fail at run time: a volume
not declared, a gateway without the enclave's socket, a COPY of a path the build never gets, a
probe on a port nobody listens on, a PIN where the gateway can see it. Prints what it checked;
exits 1 on any error.
"""
import fnmatch
import glob
import os
import re
import subprocess
import sys
from urllib.parse import urlsplit

import yaml

sys.dont_write_bytecode = True  # no __pycache__ left in deploy/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import helm_render  # noqa: E402

DEPLOY = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DEPLOY)
errors = []


def check(cond, msg):
    if not cond:
        errors.append(msg)
    return cond


def read(path):
    with open(path) as f:
        return f.read()


def env_names(crate):
    """The COFFER_* names a crate's source reads (string literals)."""
    names = set()
    for path in glob.glob(os.path.join(ROOT, crate, "src", "**", "*.rs"), recursive=True):
        names |= set(re.findall(r'"(COFFER_[A-Z0-9_]+)"', read(path)))
    return names


KNOWN_ENV = {"gateway": env_names("gateway"), "enclave": env_names("enclave"), "other": set()}
# Never set as an environment value in a file: they are the PINs themselves.
FORBIDDEN_ENV = {"COFFER_HSM_PIN", "COFFER_HSM_SO_PIN"}
SECRETISH = re.compile(r"(^|_)(PIN|PASSWORD|SECRET|PASSPHRASE|PRIVATE_KEY)(_|$)", re.I)


def check_env(where, role, env):
    for name, value in env.items():
        check(name not in FORBIDDEN_ENV, f"{where}: {name} set in a file: PINs come from files (COFFER_HSM_PIN_FILE)")
        if name.startswith("COFFER_"):
            check(name in KNOWN_ENV[role], f"{where}: {name} is not read by coffer-{role} (typo?)")
        elif SECRETISH.search(name):
            check(name.endswith("_FILE"), f"{where}: {name} looks like a secret value; pass a file (_FILE)")
        if role == "gateway":
            check(not re.search(r"(^|_)(HSM|PIN|PKCS11)(_|$)", name), f"{where}: {name}: the gateway gets nothing of the HSM")
        if name == "COFFER_STORE_URL" and isinstance(value, str):
            check(urlsplit(value).password is None, f"{where}: COFFER_STORE_URL carries a password in the file")


def port_of(addr):
    return int(str(addr).rsplit(":", 1)[1])


# ---------------------------------------------------------------------------------------------
# systemd/*.toml against the units and the config structs

def struct_fields(path, struct):
    src = read(os.path.join(ROOT, path))
    body = re.search(r"pub struct " + struct + r" \{(.*?)\n\}", src, re.S)
    return set(re.findall(r"^\s*pub (\w+):", body.group(1), re.M)) if body else set()


def unit_values(path):
    vals = {}
    for line in read(path).splitlines():
        m = re.match(r"^([A-Za-z]+)=(.*)$", line)
        if m:
            vals.setdefault(m.group(1), []).append(m.group(2))
    return vals


def lint_systemd_config():
    try:
        import tomllib
    except ImportError:
        print("  skipped: systemd/*.toml (no tomllib: Python < 3.11)")
        return
    sd = os.path.join(DEPLOY, "systemd")
    cfg = {}
    for role, struct in (("enclave", "EnclaveConfig"), ("gateway", "GatewayConfig")):
        with open(os.path.join(sd, f"coffer-{role}.toml"), "rb") as f:
            cfg[role] = tomllib.load(f)
        fields = struct_fields(f"{role}/src/config.rs", struct)
        check(fields, f"{role}/src/config.rs: struct {struct} not found")
        for key in cfg[role]:
            check(key in fields, f"systemd/coffer-{role}.toml: unknown key {key!r} (the {role} refuses it)")
        unit = unit_values(os.path.join(sd, f"coffer-{role}.service"))
        check(f"--config /etc/coffer/coffer-{role}.toml" in " ".join(unit.get("ExecStart", [])),
              f"systemd/coffer-{role}.service: ExecStart does not read /etc/coffer/coffer-{role}.toml")
        cfg[role + "_unit"] = unit
    sock = cfg["enclave"].get("socket")
    check(sock == cfg["gateway"].get("enclave_socket"),
          "systemd: the enclave's socket and the gateway's enclave_socket differ")
    rundir = cfg["enclave_unit"].get("RuntimeDirectory", ["?"])[0]
    check(os.path.dirname(sock or "") == f"/run/{rundir}",
          f"systemd: socket {sock} is not in the enclave's RuntimeDirectory /run/{rundir}")
    check(sock in " ".join(cfg["enclave_unit"].get("ExecStartPost", [])),
          "systemd/coffer-enclave.service: ExecStartPost does not wait for the configured socket")
    check(cfg["enclave"].get("pin_file") in cfg["gateway_unit"].get("InaccessiblePaths", [""])[0].split(),
          "systemd/coffer-gateway.service: InaccessiblePaths= does not hide the enclave's pin_file")
    print("  systemd/*.toml: keys known to the config structs; socket, RuntimeDirectory, pin_file agree")


# ---------------------------------------------------------------------------------------------
# Dockerfile (+ Dockerfile.dockerignore)

def dockerfile_instructions(path):
    lines, buf = [], ""
    for raw in read(path).splitlines():
        if not buf and (raw.strip().startswith("#") or not raw.strip()):
            continue
        if raw.strip().startswith("#"):
            continue
        buf += raw.rstrip()
        if buf.endswith("\\"):
            buf = buf[:-1] + " "
            continue
        word, _, rest = buf.strip().partition(" ")
        lines.append((word.upper(), rest.strip()))
        buf = ""
    return lines


def dockerignore_allows(patterns, path):
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = path.split("/")
    allowed = True
    for pat in patterns:
        neg = pat.startswith("!")
        p = pat[1:] if neg else pat
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if fnmatch.fnmatchcase(prefix, p) or (p.startswith("**/") and fnmatch.fnmatchcase(prefix, p[3:])) \
                    or (p.startswith("**/") and fnmatch.fnmatchcase(prefix, "*/" + p[3:])):
                allowed = neg
                break
    return allowed


def workspace_members():
    text = read(os.path.join(ROOT, "Cargo.toml"))
    m = re.search(r"^members\s*=\s*\[(.*?)\]", text, re.S | re.M)
    return re.findall(r'"([^"]+)"', m.group(1)) if m else []


def package_name(member):
    m = re.search(r'^name\s*=\s*"([^"]+)"', read(os.path.join(ROOT, member, "Cargo.toml")), re.M)
    return m.group(1) if m else None


def bin_names(member):
    return re.findall(r'\[\[bin\]\]\s*\nname\s*=\s*"([^"]+)"', read(os.path.join(ROOT, member, "Cargo.toml")))


def lint_dockerfile():
    path = os.path.join(DEPLOY, "Dockerfile")
    ignore = [l.strip() for l in read(path + ".dockerignore").splitlines() if l.strip() and not l.startswith("#")]
    stages, parent, current = {}, {}, None
    copied, built_pkgs, bins_copied = set(), [], set()
    for word, rest in dockerfile_instructions(path):
        if word == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?$", rest, re.I)
            if not check(m, f"Dockerfile: cannot parse FROM {rest}"):
                continue
            image, current = m.group(1), (m.group(2) or f"#{len(stages)}")
            parent[current] = image if image in stages else None
            check(image in stages or ":" in image, f"Dockerfile: FROM {image}: neither an earlier stage nor a tagged image")
            stages[current] = {"user": None, "text": "", "entrypoint": False}
        elif current is None:
            check(word in ("ARG",), f"Dockerfile: {word} before FROM")
            continue
        stages[current]["text"] += f"\n{word} {rest}"
        if word == "USER":
            stages[current]["user"] = rest
        if word == "ENTRYPOINT":
            stages[current]["entrypoint"] = True
        if word == "COPY":
            args = rest.split()
            flags = [a for a in args if a.startswith("--")]
            srcs = [a for a in args if not a.startswith("--")][:-1]
            src_stage = next((f.split("=", 1)[1] for f in flags if f.startswith("--from=")), None)
            if src_stage:
                check(src_stage in stages and src_stage != current, f"Dockerfile: COPY --from={src_stage}: no earlier stage")
                if src_stage == "build":
                    bins_copied |= {os.path.basename(s) for s in srcs}
                continue
            for s in srcs:
                s = s.rstrip("/")
                found = glob.glob(os.path.join(ROOT, s))
                check(found, f"Dockerfile: COPY {s}: not in the repository")
                check(dockerignore_allows(ignore, s), f"Dockerfile: COPY {s}: excluded by Dockerfile.dockerignore")
                copied.add(s)
        if word == "RUN" and "cargo build" in rest:
            check("--locked" in rest and "--release" in rest, "Dockerfile: cargo build without --release --locked")
            built_pkgs = re.findall(r"-p\s+(\S+)", rest)
    members = workspace_members()
    check(members, "Cargo.toml: no workspace members found")
    for need in ["Cargo.toml", "Cargo.lock"] + members:
        check(need in copied, f"Dockerfile: workspace needs {need} but the build stage does not COPY it")
    names = {package_name(m): m for m in members}
    bins = set()
    for pkg in built_pkgs:
        if check(pkg in names, f"Dockerfile: cargo build -p {pkg}: no such workspace package"):
            bins |= set(bin_names(names[pkg]))
    check(bins and bins == bins_copied, f"Dockerfile: binaries copied from build {sorted(bins_copied)} != built {sorted(bins)}")

    def inherited(stage, key):
        while stage:
            if stages[stage][key]:
                return stages[stage][key]
            stage = parent.get(stage)
        return None

    def lineage_text(stage):
        text = ""
        while stage:
            text = stages[stage]["text"] + text
            stage = parent.get(stage)
        return text

    for target in ("gateway", "enclave"):
        if not check(target in stages, f"Dockerfile: no stage {target!r}"):
            continue
        user = inherited(target, "user")
        check(user and user not in ("root", "0"), f"Dockerfile: stage {target} runs as root")
        check(user and re.search(r"useradd\b[^\n]*\b" + re.escape(user or "-") + r"\b", lineage_text(target)),
              f"Dockerfile: stage {target}: USER {user} is never created")
        check(inherited(target, "entrypoint"), f"Dockerfile: stage {target} has no ENTRYPOINT")
        check(user == f"coffer-{target}", f"Dockerfile: stage {target} runs as {user}, not coffer-{target}")
    installs_softhsm = re.compile(r"apt-get install[^\n]*\ssofthsm2(\s|$)", re.M)
    check(installs_softhsm.search(stages.get("enclave", {}).get("text", "")), "Dockerfile: the enclave stage does not install softhsm2")
    check(not installs_softhsm.search(lineage_text("gateway") if "gateway" in stages else ""),
          "Dockerfile: the gateway stage ships softhsm2")
    for name in ("gateway", "enclave"):
        for env in re.findall(r"\b(COFFER_[A-Z0-9_]+)=", lineage_text(name) if name in stages else ""):
            check(env in KNOWN_ENV[name] and env not in FORBIDDEN_ENV, f"Dockerfile: ENV {env} in stage {name}")
    print(f"  Dockerfile: stages {', '.join(s for s in stages if not s.startswith('#'))}; COPY sources exist and pass"
          f" the .dockerignore; all {len(members)} workspace members copied; binaries {sorted(bins)}; non-root users")
    return stages


# ---------------------------------------------------------------------------------------------
# compose.yaml (+ compose/haproxy.cfg)

def as_env(env):
    if isinstance(env, list):
        return dict(e.split("=", 1) if "=" in e else (e, None) for e in env)
    return dict(env or {})


def mounts(svc):
    out = []
    for v in svc.get("volumes", []):
        if isinstance(v, dict):
            out.append((v.get("source"), v.get("target"), v.get("read_only", False)))
        else:
            parts = v.split(":")
            out.append((parts[0], parts[1] if len(parts) > 1 else parts[0], len(parts) > 2 and "ro" in parts[2].split(",")))
    return out


def names_of(x):
    if isinstance(x, dict):
        return list(x)
    return [e if isinstance(e, str) else e.get("source") for e in (x or [])]


def under(path, directory):
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def lint_compose(stages):
    c = yaml.safe_load(read(os.path.join(DEPLOY, "compose.yaml")))
    services = c.get("services", {})
    vols, secrets, nets = c.get("volumes", {}) or {}, c.get("secrets", {}) or {}, c.get("networks", {}) or {}
    used_vols, used_secrets, used_nets = set(), set(), set()
    roles = {}
    for name, s in services.items():
        where = f"compose.yaml: service {name}"
        check("image" in s or "build" in s, f"{where}: neither image nor build")
        b = s.get("build")
        if isinstance(b, dict):
            ctx = os.path.normpath(os.path.join(DEPLOY, b.get("context", ".")))
            check(os.path.isfile(os.path.join(ctx, b.get("dockerfile", "Dockerfile"))), f"{where}: no Dockerfile at {b}")
            check(b.get("target") in stages, f"{where}: build target {b.get('target')!r} is no Dockerfile stage")
            roles[name] = b.get("target") if b.get("target") in KNOWN_ENV else "other"
        for src, dst, _ in mounts(s):
            if src.startswith((".", "/")):
                check(os.path.exists(os.path.join(DEPLOY, src)), f"{where}: bind source {src} does not exist")
            else:
                check(src in vols, f"{where}: volume {src} not declared under volumes:")
                used_vols.add(src)
        for sec in names_of(s.get("secrets")):
            check(sec in secrets, f"{where}: secret {sec} not declared under secrets:")
            used_secrets.add(sec)
        for net in names_of(s.get("networks")):
            check(net in nets, f"{where}: network {net} not declared under networks:")
            used_nets.add(net)
        if s.get("network_mode") == "none":
            check(not s.get("networks") and not s.get("ports"), f"{where}: network_mode none with networks or ports")
        if s.get("ports"):
            check(any(not (nets.get(n) or {}).get("internal") for n in names_of(s.get("networks"))),
                  f"{where}: publishes ports but is only on internal networks")
        deps = s.get("depends_on", {})
        for dep in names_of(deps):
            if check(dep in services, f"{where}: depends_on unknown service {dep}"):
                cond = deps[dep].get("condition") if isinstance(deps, dict) else None
                if cond == "service_healthy":
                    check((services[dep].get("healthcheck") or {}).get("test"),
                          f"{where}: waits for {dep} to be healthy, which has no healthcheck")
        check_env(where, roles.get(name, "other"), as_env(s.get("environment")))
    for kind, declared, used in (("volume", vols, used_vols), ("secret", secrets, used_secrets), ("network", nets, used_nets)):
        for d in declared:
            check(d in used, f"compose.yaml: {kind} {d} declared but never used")
    # Secret files: development-only, never committed.
    for sec, spec in secrets.items():
        f = os.path.normpath(os.path.join(DEPLOY, spec.get("file", "")))
        check(under(f, os.path.join(DEPLOY, "secrets")), f"compose.yaml: secret {sec} outside deploy/secrets/")
        rel = os.path.relpath(f, ROOT)
        if os.path.isdir(os.path.join(ROOT, ".git")):
            ignored = subprocess.run(["git", "-C", ROOT, "check-ignore", "-q", "--no-index", rel]).returncode == 0
            check(ignored, f"compose.yaml: secret file {rel} is not ignored by git")
    gateways = [n for n, r in roles.items() if r == "gateway"]
    enclaves = [n for n, r in roles.items() if r == "enclave"]
    check(len(gateways) >= 2 and enclaves, "compose.yaml: expected two gateways and an enclave")
    for e in enclaves:
        for g in gateways:
            shared = set(names_of(services[e].get("secrets"))) & set(names_of(services[g].get("secrets")))
            check(not shared, f"compose.yaml: {g} gets the enclave's secrets {sorted(shared)}")
    # Every gateway reaches an enclave's socket through the same named volume.
    sockets_by_volume = {}
    for e in enclaves:
        sock = as_env(services[e].get("environment")).get("COFFER_ENCLAVE_SOCKET")
        for src, dst, _ in mounts(services[e]):
            if sock and under(sock, dst) and src in vols:
                sockets_by_volume[(src, os.path.relpath(sock, dst))] = e
    for g in gateways:
        env = as_env(services[g].get("environment"))
        socks = [p.strip() for p in (env.get("COFFER_ENCLAVE_SOCKETS") or env.get("COFFER_ENCLAVE_SOCKET") or "").split(",") if p.strip()]
        check(socks, f"compose.yaml: {g} names no enclave socket")
        for sock in socks:
            hit = [(src, os.path.relpath(sock, dst)) for src, dst, _ in mounts(services[g]) if under(sock, dst) and src in vols]
            check(any(h in sockets_by_volume for h in hit), f"compose.yaml: {g}'s socket {sock} is in no volume an enclave serves it in")
        url = urlsplit(env.get("COFFER_STORE_URL", ""))
        check(url.scheme in ("postgres", "postgresql"), f"compose.yaml: {g}: COFFER_STORE_URL is not postgres://")
        db = services.get(url.hostname or "")
        if check(db is not None, f"compose.yaml: {g}: database host {url.hostname} is no service"):
            denv = as_env(db.get("environment"))
            check(url.username == denv.get("POSTGRES_USER"), f"compose.yaml: {g}: database user differs from POSTGRES_USER")
            check(url.path.lstrip("/") == denv.get("POSTGRES_DB"), f"compose.yaml: {g}: database name differs from POSTGRES_DB")
            check(set(names_of(services[g].get("networks"))) & set(names_of(db.get("networks"))),
                  f"compose.yaml: {g} shares no network with {url.hostname}")
            check(all((nets.get(n) or {}).get("internal") for n in names_of(db.get("networks"))),
                  f"compose.yaml: {url.hostname} is on a non-internal network (the store has no TLS)")
            pwfile = env.get("STORE_PASSWORD_FILE", "")
            check(pwfile == denv.get("POSTGRES_PASSWORD_FILE"), f"compose.yaml: {g}: password file differs from the database's")
    pg = [s.get("image", "") for s in services.values() if str(s.get("image", "")).startswith("postgres:")]
    check(len(pg) == 1 and pg[0].split(":")[1].split("-")[0] == "15", f"compose.yaml: PostgreSQL images {pg}, not one postgres:15")
    lint_haproxy(services, gateways)
    print(f"  compose.yaml: {len(services)} services; volumes, secrets, networks, depends_on consistent;"
          f" {', '.join(gateways)} share {', '.join(enclaves)}'s socket volume and the database")


def lint_haproxy(services, gateways):
    lbs = [(n, src) for n, s in services.items() for src, dst, _ in mounts(s) if dst.endswith("haproxy.cfg")]
    if not check(len(lbs) == 1, "compose.yaml: no (single) HAProxy service mounting a haproxy.cfg"):
        return
    lb, src = lbs[0]
    cfg = read(os.path.join(DEPLOY, src))
    check(re.search(r"^\s*http-check send meth GET uri /readyz\s*$", cfg, re.M), "haproxy.cfg: health check is not GET /readyz")
    check(re.search(r"^\s*option httpchk\b", cfg, re.M), "haproxy.cfg: no option httpchk")
    default = re.search(r"^\s*default-server\b(.*)$", cfg, re.M)
    servers = re.findall(r"^\s*server\s+(\S+)\s+([^:\s]+):(\d+)(.*)$", cfg, re.M)
    check({h for _, h, _, _ in servers} == set(gateways), f"haproxy.cfg: servers {[h for _, h, _, _ in servers]} != gateways {gateways}")
    for _, host, port, opts in servers:
        if host not in services:
            continue
        env = as_env(services[host].get("environment"))
        check(int(port) == port_of(env.get("COFFER_LISTEN", ":0")), f"haproxy.cfg: {host}:{port} is not its COFFER_LISTEN")
        m = re.search(r"\bport (\d+)", opts) or (default and re.search(r"\bport (\d+)", default.group(1)))
        check(m and int(m.group(1)) == port_of(env.get("COFFER_OPS_LISTEN", ":0")),
              f"haproxy.cfg: {host}'s check port is not its COFFER_OPS_LISTEN")
        check(set(names_of(services[host].get("networks"))) & set(names_of(services[lb].get("networks"))),
              f"compose.yaml: {lb} shares no network with {host}")
    bind = re.search(r"^\s*bind\s+\S*:(\d+)", cfg, re.M)
    check(bind and any(str(p).endswith(":" + bind.group(1)) for p in services[lb].get("ports", [])),
          f"compose.yaml: {lb} does not publish HAProxy's bind port")


# ---------------------------------------------------------------------------------------------
# Helm chart

API = {"Deployment": "apps/v1", "Service": "v1", "ConfigMap": "v1", "PodDisruptionBudget": "policy/v1",
       "HorizontalPodAutoscaler": "autoscaling/v2", "Job": "batch/v1"}
DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def lint_manifests(docs, values, variant):
    w = f"helm ({variant})"
    by_kind = {}
    for d in docs:
        if not check(isinstance(d, dict) and d.get("kind") and d.get("apiVersion") and d.get("metadata", {}).get("name"),
                     f"{w}: a manifest without apiVersion, kind or metadata.name"):
            continue
        kind, name = d["kind"], d["metadata"]["name"]
        check(API.get(kind) == d["apiVersion"], f"{w}: {kind} {name}: apiVersion {d['apiVersion']} (expected {API.get(kind)})")
        check(DNS1123.match(name) and len(name) <= 63, f"{w}: {kind} name {name!r} is not a DNS label")
        check(name not in by_kind.get(kind, {}), f"{w}: two {kind}s named {name}")
        by_kind.setdefault(kind, {})[name] = d
    check("Secret" not in by_kind, f"{w}: the chart renders a Secret; secrets come from existing Secrets")
    for name, cm in by_kind.get("ConfigMap", {}).items():
        for k, v in (cm.get("data") or {}).items():
            check(isinstance(v, str), f"{w}: ConfigMap {name}: {k} is not a string (quote it in values)")
    deps = list(by_kind.get("Deployment", {}).values())
    if not check(len(deps) == 1, f"{w}: expected one Deployment"):
        return
    dep = deps[0]
    pod = dep["spec"]["template"]
    labels = pod["metadata"].get("labels", {})
    sel = dep["spec"]["selector"]["matchLabels"]
    check(sel.items() <= labels.items(), f"{w}: Deployment selector does not match its pod labels")
    lint_pod(w, pod["spec"], by_kind, values, serving=True)
    check(("replicas" in dep["spec"]) != bool(values["autoscaling"]["enabled"]),
          f"{w}: Deployment replicas must be set exactly when the HPA is off")
    for svc in by_kind.get("Service", {}).values():
        check(svc["spec"]["selector"].items() <= labels.items(), f"{w}: Service {svc['metadata']['name']} selects no gateway pod")
        gw_ports = {p["name"] for c in pod["spec"]["containers"] if c["name"] == "gateway" for p in c.get("ports", [])}
        for p in svc["spec"]["ports"]:
            check(p.get("targetPort") in gw_ports, f"{w}: Service port {p.get('name')} targets {p.get('targetPort')}, no gateway port")
    pdbs = list(by_kind.get("PodDisruptionBudget", {}).values())
    check(len(pdbs) == int(bool(values["podDisruptionBudget"]["enabled"])), f"{w}: PodDisruptionBudget present != enabled")
    for pdb in pdbs:
        check(pdb["spec"]["selector"]["matchLabels"].items() <= labels.items(), f"{w}: the PDB selects no gateway pod")
        check(("minAvailable" in pdb["spec"]) != ("maxUnavailable" in pdb["spec"]), f"{w}: PDB needs exactly one bound")
    hpas = list(by_kind.get("HorizontalPodAutoscaler", {}).values())
    check(len(hpas) == int(bool(values["autoscaling"]["enabled"])), f"{w}: HPA present != enabled")
    for hpa in hpas:
        ref = hpa["spec"]["scaleTargetRef"]
        check(ref.get("kind") == "Deployment" and ref.get("name") == dep["metadata"]["name"], f"{w}: HPA scales {ref}")
        check(1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"], f"{w}: HPA min/max replicas")
        for ctr in pod["spec"]["containers"]:
            check(ctr.get("resources", {}).get("requests", {}).get("cpu"),
                  f"{w}: container {ctr['name']} has no CPU request, which the HPA's utilization needs")
    jobs = list(by_kind.get("Job", {}).values())
    check(len(jobs) == int(bool(values["enclave"]["initJob"]["enabled"])), f"{w}: init Job present != enabled")
    for job in jobs:
        check("pre-install" in job["metadata"].get("annotations", {}).get("helm.sh/hook", ""), f"{w}: the init Job is no pre-install hook")
        check(job["spec"]["template"]["spec"].get("restartPolicy") in ("Never", "OnFailure"), f"{w}: Job restartPolicy")
        lint_pod(w + " Job", job["spec"]["template"]["spec"], by_kind, values, serving=False)


# Fields of the Kubernetes API this chart may use; a misindented template puts keys elsewhere.
POD_FIELDS = {"containers", "initContainers", "volumes", "securityContext", "automountServiceAccountToken",
              "restartPolicy", "nodeSelector", "tolerations", "affinity", "serviceAccountName",
              "topologySpreadConstraints", "terminationGracePeriodSeconds", "priorityClassName"}
CONTAINER_FIELDS = {"name", "image", "imagePullPolicy", "command", "args", "env", "envFrom", "ports",
                    "readinessProbe", "livenessProbe", "startupProbe", "volumeMounts", "resources",
                    "securityContext", "workingDir", "lifecycle"}


def lint_pod(w, spec, by_kind, values, serving):
    check(set(spec) <= POD_FIELDS, f"{w}: unknown pod spec fields {sorted(set(spec) - POD_FIELDS)}")
    for c in spec.get("containers", []):
        check(set(c) <= CONTAINER_FIELDS, f"{w}: unknown container fields {sorted(set(c) - CONTAINER_FIELDS)}")
        check(isinstance(c.get("resources", {}), dict), f"{w}: {c.get('name')}: resources is empty")
    containers = {c["name"]: c for c in spec.get("containers", [])}
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    check(spec.get("automountServiceAccountToken") is False, f"{w}: pods get a service account token they never use")
    mounted = {}
    for c in containers.values():
        check(c.get("image"), f"{w}: container {c['name']} has no image")
        for m in c.get("volumeMounts", []):
            check(m["name"] in volumes, f"{w}: {c['name']} mounts undeclared volume {m['name']}")
            mounted.setdefault(m["name"], []).append((c["name"], m["mountPath"]))
        for ef in c.get("envFrom", []):
            ref = ef.get("configMapRef", {}).get("name")
            check(ref in by_kind.get("ConfigMap", {}), f"{w}: {c['name']} reads ConfigMap {ref}, which is not rendered")
        sc = c.get("securityContext", {})
        for key, want in (("runAsNonRoot", True), ("readOnlyRootFilesystem", True), ("allowPrivilegeEscalation", False)):
            check(sc.get(key) is want, f"{w}: {c['name']}: securityContext.{key} is not {want}")
        check(sc.get("privileged") is not True and "ALL" in sc.get("capabilities", {}).get("drop", []) and sc.get("runAsUser", 0) != 0,
              f"{w}: {c['name']}: privileged, keeps capabilities or runs as uid 0")
    check(spec.get("securityContext", {}).get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{w}: no RuntimeDefault seccomp")
    for v in volumes:
        check(v in mounted, f"{w}: volume {v} is mounted by no container")
    enclave_name = "enclave" if serving else "enclave-init"
    enclave = containers.get(enclave_name)
    if not check(enclave, f"{w}: no {enclave_name} container"):
        return
    env = {e["name"]: e for e in enclave.get("env", [])}
    envfrom_keys = set()
    for ef in enclave.get("envFrom", []):
        envfrom_keys |= set((by_kind.get("ConfigMap", {}).get(ef["configMapRef"]["name"], {}).get("data") or {}))
    check_env(f"{w}: {enclave_name}", "enclave", {**{k: "" for k in envfrom_keys}, **{k: e.get("value") for k, e in env.items()}})
    check(env.get("COFFER_PKCS11_MODULE", {}).get("value") == values["enclave"]["pkcs11Module"], f"{w}: PKCS#11 module not from values")
    # The PIN: a file from a Secret volume that only the enclave container mounts.
    pin = env.get("COFFER_HSM_PIN_FILE", {}).get("value", "")
    pin_vols = [n for n, v in volumes.items() if "secret" in v and any(under(pin, p) for c, p in mounted.get(n, []) if c == enclave_name)]
    if check(pin_vols, f"{w}: COFFER_HSM_PIN_FILE {pin!r} is on no Secret volume of the enclave container"):
        vol = volumes[pin_vols[0]]["secret"]
        check(vol.get("secretName") == values["enclave"]["pinSecret"], f"{w}: the PIN Secret is not enclave.pinSecret")
        items = {i["path"]: i["key"] for i in vol.get("items", [])}
        check(items.get(os.path.basename(pin)) == values["enclave"]["pinKey"], f"{w}: the PIN file is not the Secret's pinKey")
        check({c for c, _ in mounted[pin_vols[0]]} == {enclave_name}, f"{w}: the PIN Secret is mounted outside the enclave container")
    if not serving:
        return
    gw = containers.get("gateway")
    if not check(gw and len(containers) == 2, f"{w}: the pod must be exactly gateway + enclave"):
        return
    genv = {e["name"]: e for e in gw.get("env", [])}
    gkeys = set()
    for ef in gw.get("envFrom", []):
        gkeys |= set((by_kind.get("ConfigMap", {}).get(ef["configMapRef"]["name"], {}).get("data") or {}))
    check_env(f"{w}: gateway", "gateway", {**{k: "" for k in gkeys}, **{k: e.get("value") for k, e in genv.items()}})
    store = genv.get("COFFER_STORE_URL", {}).get("valueFrom", {}).get("secretKeyRef", {})
    check(store.get("name") == values["database"]["existingSecret"] and store.get("key") == values["database"]["urlKey"],
          f"{w}: COFFER_STORE_URL does not come from database.existingSecret")
    # The socket: same path in both, on an emptyDir both mount.
    gsock, esock = genv.get("COFFER_ENCLAVE_SOCKET", {}).get("value"), env.get("COFFER_ENCLAVE_SOCKET", {}).get("value")
    check(gsock and gsock == esock, f"{w}: gateway and enclave name different sockets ({gsock}, {esock})")
    shared = [n for n, v in volumes.items() if "emptyDir" in v
              and {c for c, p in mounted.get(n, []) if gsock and under(gsock, p)} == {"gateway", "enclave"}]
    check(shared, f"{w}: no emptyDir holds the socket for both containers")
    # Probes on the ops listener, paths as specified.
    ports = {p["name"]: p["containerPort"] for p in gw.get("ports", [])}
    check(ports.get("http") == port_of(genv.get("COFFER_LISTEN", {}).get("value", ":0")), f"{w}: port http is not COFFER_LISTEN's")
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        hg = gw.get(probe, {}).get("httpGet", {})
        check(hg.get("path") == path, f"{w}: gateway {probe} is not GET {path}")
        port = ports.get(hg.get("port"), hg.get("port"))
        check(port == port_of(genv.get("COFFER_OPS_LISTEN", {}).get("value", ":0")), f"{w}: gateway {probe} is not on COFFER_OPS_LISTEN")


def lint_helm():
    chart = os.path.join(DEPLOY, "helm", "coffer")
    meta = yaml.safe_load(read(os.path.join(chart, "Chart.yaml")))
    check(meta.get("apiVersion") == "v2" and meta.get("name") and meta.get("version"), "Chart.yaml: apiVersion v2, name, version")
    base = helm_render.load_values(chart)
    for path, v in walk(base):
        if isinstance(v, str):
            check(not re.search(r"://[^/@\s]*:[^/@\s]*@", v), f"values.yaml: {path} holds a URL with a password")
            check(not re.search(r"(pin|password|url)$", path, re.I) or not v, f"values.yaml: {path} holds a value; name a Secret instead")
    try:
        helm_render.render_chart(chart, base)
        check(False, "helm: the default values render, but enclave.pkcs11Module must be required")
    except helm_render.RenderError as e:
        check("pkcs11Module" in str(e), f"helm: default values fail for another reason: {e}")
    lint_values = os.path.join(chart, "ci", "lint-values.yaml")
    # Each switch on and off somewhere, no two switches alike in every set, every optional block filled.
    variants = {
        "ci/lint-values.yaml": {},
        "PDB off": {"podDisruptionBudget": {"enabled": False}},
        "init Job off": {"enclave": {"initJob": {"enabled": False}}},
        "HPA off, every optional list and map set": {
            "autoscaling": {"enabled": False},
            "enclave": {"extraVolumeMounts": [{"name": "luna", "mountPath": "/etc/luna"}]},
            "extraVolumes": [{"name": "luna", "secret": {"secretName": "luna-client"}}],
            "nodeSelector": {"hsm": "luna"}, "tolerations": [{"key": "hsm", "operator": "Exists"}],
            "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        },
    }
    for variant, override in variants.items():
        values = helm_render.load_values(chart, [lint_values], override)
        try:
            rendered = helm_render.render_chart(chart, values)
        except helm_render.RenderError as e:
            check(False, f"helm ({variant}): {e}")
            continue
        docs, notes = [], ""
        for rel, text in rendered.items():
            if rel.endswith("NOTES.txt"):
                notes = text
                continue
            try:
                docs += [d for d in yaml.safe_load_all(text) if d is not None]
            except yaml.YAMLError as e:
                check(False, f"helm ({variant}): {rel} renders to invalid YAML: {e}")
        try:
            lint_manifests(docs, values, variant)
        except (KeyError, TypeError, AttributeError, IndexError) as e:
            check(False, f"helm ({variant}): a manifest lacks a field or has the wrong shape: {e!r}")
        check(
            re.search(r"TCP\s+with\s+mutual\s+TLS", notes) is not None and "NOT in this chart" in notes,
            "NOTES.txt: must say a separate enclave Deployment (TCP+mTLS) is not in the chart",
        )
    readme = read(os.path.join(chart, "README.md"))
    check(
        re.search(r"TCP\s+with\s+mutual\s+TLS", readme) is not None and "not in this chart" in readme,
        "helm/coffer/README.md: must say a separate enclave Deployment (TCP+mTLS) is not in the chart",
    )
    print(f"  helm/coffer: rendered {len(variants)} value sets (and the defaults, which must fail on"
          f" enclave.pkcs11Module); kinds, apiVersions, selectors, probes, socket, PIN, securityContexts")


def walk(v, path=""):
    if isinstance(v, dict):
        for k, x in v.items():
            yield from walk(x, f"{path}.{k}" if path else k)
    else:
        yield path, v


def main():
    print("deploy/lint_deploy.py:")
    lint_systemd_config()
    stages = lint_dockerfile()
    lint_compose(stages)
    lint_helm()
    for e in errors:
        print(f"ERROR {e}", file=sys.stderr)
    if errors:
        sys.exit(1)


if __name__ == "__main__":
    main()
