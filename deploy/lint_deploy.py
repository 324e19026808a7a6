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
from urllib.parse import unquote, urlsplit

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


# Both binaries read what coffer-process (process/: logging, configuration files) reads.
KNOWN_ENV = {
    "gateway": env_names("gateway") | env_names("process"),
    "enclave": env_names("enclave") | env_names("process"),
    "other": set(),
}
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
        if name in ("COFFER_STORE_URL", "COFFER_AUTHORITY_STORE_URL") and isinstance(value, str):
            check(urlsplit(value).password is None, f"{where}: {name} carries a password in the file")


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
    hidden = {p.lstrip("-") for line in cfg["gateway_unit"].get("InaccessiblePaths", []) for p in line.split()}
    check(cfg["enclave"].get("pin_file") in cfg["gateway_unit"].get("InaccessiblePaths", [""])[0].split(),
          "systemd/coffer-gateway.service: InaccessiblePaths= does not hide the enclave's pin_file")
    # The authority store: SQLite in the enclave's StateDirectory, or PostgreSQL with its password
    # in a file the gateway's unit cannot see.
    statedir = {r: "/var/lib/" + cfg[r + "_unit"].get("StateDirectory", ["?"])[0] for r in ("enclave", "gateway")}
    store = cfg["enclave"].get("authority_store", "")
    if store.startswith("sqlite://"):
        check(os.path.dirname(store[len("sqlite://"):]) == statedir["enclave"],
              f"systemd: authority_store {store} is not in the enclave's StateDirectory {statedir['enclave']}")
    else:
        check(urlsplit(store).scheme in ("postgres", "postgresql") and urlsplit(store).password is None,
              f"systemd: authority_store {store!r} is neither sqlite:// nor postgres:// without a password")
        check(cfg["enclave"].get("authority_store_password_file") in hidden,
              "systemd/coffer-gateway.service: InaccessiblePaths= does not hide authority_store_password_file")
    check(statedir["enclave"] in hidden, "systemd/coffer-gateway.service: InaccessiblePaths= does not hide the enclave's StateDirectory")
    gstore = cfg["gateway"].get("store_url", "")
    check(not gstore.startswith("sqlite://") or os.path.dirname(gstore[len("sqlite://"):]) == statedir["gateway"],
          f"systemd: the gateway's store_url {gstore} is not in its StateDirectory {statedir['gateway']}")
    # tmpfiles.d: the same directories, owners and modes as the units' RuntimeDirectory= and
    # StateDirectory=, so operator commands work before the first start and while a unit is
    # stopped; the enclave's runtime directory outlives the unit, and a stale socket is removed.
    tmpfiles = {}
    for line in read(os.path.join(sd, "coffer.tmpfiles.conf")).splitlines():
        f = line.split()
        if f and not f[0].startswith("#"):
            check(len(f) == 6 and f[0] == "d" and f[5] == "-", f"systemd/coffer.tmpfiles.conf: {line!r} is not `d PATH MODE USER GROUP -`")
            tmpfiles[f[1]] = tuple(f[2:5])
    want = {}
    for role in ("enclave", "gateway"):
        u = cfg[role + "_unit"]
        owner = (u.get("User", ["?"])[0], u.get("Group", u.get("User", ["?"]))[0])
        for kind, base in (("Runtime", "/run/"), ("State", "/var/lib/")):
            for d in u.get(kind + "Directory", []):
                want[base + d] = (u.get(kind + "DirectoryMode", ["0755"])[0],) + owner
    check(tmpfiles == want, f"systemd/coffer.tmpfiles.conf: {tmpfiles} differs from the units' directories {want}")
    eu = cfg["enclave_unit"]
    check(eu.get("RuntimeDirectoryPreserve") == ["yes"], "systemd/coffer-enclave.service: RuntimeDirectoryPreserve=yes missing")
    check(any(re.search(r"\brm -f " + re.escape(sock or "-") + r"$", x) for x in eu.get("ExecStartPre", [])),
          "systemd/coffer-enclave.service: no ExecStartPre= removing a stale socket before ExecStartPost= waits for it")
    print("  systemd/*.toml: keys known to the config structs; socket, RuntimeDirectory, pin_file, authority store agree;"
          " coffer.tmpfiles.conf matches the units' directories")


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


# Build contexts the Dockerfile takes by name, and the one stage that may read each.
NAMED_CONTEXTS = {"binaries": "prebuilt"}


def lint_dockerfile():
    path = os.path.join(DEPLOY, "Dockerfile")
    ignore = [l.strip() for l in read(path + ".dockerignore").splitlines() if l.strip() and not l.startswith("#")]
    stages, parent, current = {}, {}, None
    copied, built_pkgs, bins_copied, bins_prebuilt = set(), [], set(), set()
    # Global ARGs (before the first FROM) with their defaults: a FROM may name an image or a stage
    # through one (`FROM ${BINARIES} AS ...`), and is checked with the default.
    global_args = {}
    for word, rest in dockerfile_instructions(path):
        if word == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?$", rest, re.I)
            if not check(m, f"Dockerfile: cannot parse FROM {rest}"):
                continue
            named, current = m.group(1), (m.group(2) or f"#{len(stages)}")
            image = re.sub(r"\$\{(\w+)\}", lambda a: global_args.get(a.group(1), "?"), named)
            check("?" not in image, f"Dockerfile: FROM {named}: an ARG without a default before the first FROM")
            parent[current] = image if image in stages else None
            check(image in stages or ":" in image or image == "scratch",
                  f"Dockerfile: FROM {named}: neither an earlier stage nor a tagged image")
            stages[current] = {"user": None, "text": "", "entrypoint": False}
        elif current is None:
            if check(word in ("ARG",), f"Dockerfile: {word} before FROM"):
                name, _, default = rest.partition("=")
                global_args[name.strip()] = default.strip()
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
            if src_stage in NAMED_CONTEXTS:
                # A build context given by name (`--build-context`), only where it is meant to be.
                check(current == NAMED_CONTEXTS[src_stage], f"Dockerfile: COPY --from={src_stage} outside stage {NAMED_CONTEXTS[src_stage]}")
                bins_prebuilt |= {os.path.basename(s) for s in srcs}
                continue
            if src_stage:
                check(src_stage in stages and src_stage != current, f"Dockerfile: COPY --from={src_stage}: no earlier stage")
                lineage, stage = [], src_stage
                while stage:
                    lineage.append(stage)
                    stage = parent.get(stage)
                if "build" in lineage:
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
    check(bins == bins_prebuilt, f"Dockerfile: prebuilt binaries {sorted(bins_prebuilt)} != built {sorted(bins)}")

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
    check(len(gateways) >= 2 and len(enclaves) >= 2, "compose.yaml: expected two gateways and two enclaves")
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
        reached = set()
        for sock in socks:
            hit = [(src, os.path.relpath(sock, dst)) for src, dst, _ in mounts(services[g]) if under(sock, dst) and src in vols]
            check(any(h in sockets_by_volume for h in hit), f"compose.yaml: {g}'s socket {sock} is in no volume an enclave serves it in")
            reached |= {sockets_by_volume[h] for h in hit if h in sockets_by_volume}
        check(reached == set(enclaves), f"compose.yaml: {g} reaches {sorted(reached)}, not every enclave {sorted(enclaves)} (failover)")
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
    check(pg and all(i.split(":")[1].split("-")[0] == "15" for i in pg), f"compose.yaml: PostgreSQL images {pg}, not postgres:15")
    store = lint_compose_authority(services, vols, enclaves, gateways)
    lint_haproxy(services, gateways)
    print(f"  compose.yaml: {len(services)} services; volumes, secrets, networks, depends_on consistent;"
          f" {', '.join(gateways)} reach each of {', '.join(enclaves)} through its socket volume and share the database;"
          f" the enclaves share the authority store ({store})")


def lint_compose_authority(services, vols, enclaves, gateways):
    """Every enclave on the same authority store, which no gateway can reach: PostgreSQL (through a
    Unix socket volume or a network) with the password as a file, or SQLite on one named volume."""
    urls = {e: as_env(services[e].get("environment")).get("COFFER_AUTHORITY_STORE_URL") for e in enclaves}
    check(all(urls.values()) and len(set(urls.values())) == 1,
          f"compose.yaml: the enclaves' COFFER_AUTHORITY_STORE_URL differ or are missing ({urls}): each would"
          " refuse the organizations another bootstrapped")
    url = next(iter(urls.values()), None) or ""
    gw_mounts = {src for g in gateways for src, _, _ in mounts(services[g])}
    gw_secrets = {x for g in gateways for x in names_of(services[g].get("secrets"))}
    if url.startswith("sqlite://"):
        path = url[len("sqlite://"):]
        homes = {e: {src for src, dst, ro in mounts(services[e]) if src in vols and under(path, dst) and not ro} for e in enclaves}
        shared = set.intersection(*homes.values()) if homes else set()
        check(shared, f"compose.yaml: the SQLite authority store {path} is on no named volume every enclave mounts writable")
        check(not shared & gw_mounts, "compose.yaml: a gateway mounts the authority store's volume")
        return "SQLite, volume " + ", ".join(sorted(shared))
    u = urlsplit(url)
    if not check(u.scheme in ("postgres", "postgresql"), f"compose.yaml: COFFER_AUTHORITY_STORE_URL {url!r} is neither sqlite:// nor postgres://"):
        return "?"
    host = unquote(u.hostname or "")
    if host.startswith("/"):
        # A Unix socket directory: a volume the enclaves mount there and a PostgreSQL service
        # mounts as its own socket directory.
        vol = {e: {src for src, dst, _ in mounts(services[e]) if src in vols and dst.rstrip("/") == host.rstrip("/")} for e in enclaves}
        shared = set.intersection(*vol.values()) if vol else set()
        dbs = [n for n, s in services.items() if str(s.get("image", "")).startswith("postgres:")
               and any(src in shared and dst.rstrip("/") in ("/var/run/postgresql", "/run/postgresql") for src, dst, _ in mounts(s))]
        check(len(dbs) == 1, f"compose.yaml: the authority store's socket directory {host} is no PostgreSQL service's, on a volume every enclave mounts")
        check(not shared & gw_mounts, "compose.yaml: a gateway mounts the authority store's socket volume")
    else:
        dbs = [host] if host in services else []
        check(dbs, f"compose.yaml: the authority store's host {host} is no service")
        for g in gateways:
            check(not set(names_of(services[g].get("networks"))) & set(names_of(services[host].get("networks"))) if dbs else True,
                  f"compose.yaml: {g} shares a network with the authority store {host}")
    if not dbs:
        return "?"
    db = services[dbs[0]]
    denv = as_env(db.get("environment"))
    check(u.username == denv.get("POSTGRES_USER") and u.path.lstrip("/") == denv.get("POSTGRES_DB"),
          f"compose.yaml: the authority store's user and database differ from {dbs[0]}'s POSTGRES_USER and POSTGRES_DB")
    gw_dbs = {urlsplit(as_env(services[g].get("environment")).get("COFFER_STORE_URL", "")).hostname for g in gateways}
    check(dbs[0] not in gw_dbs, f"compose.yaml: {dbs[0]} is the gateways' database too")
    pwfile = denv.get("POSTGRES_PASSWORD_FILE", "")
    secret = pwfile[len("/run/secrets/"):] if pwfile.startswith("/run/secrets/") else None
    for e in enclaves:
        check(as_env(services[e].get("environment")).get("COFFER_AUTHORITY_STORE_PASSWORD_FILE") == pwfile
              and secret in names_of(services[e].get("secrets")),
              f"compose.yaml: {e}: COFFER_AUTHORITY_STORE_PASSWORD_FILE is not {dbs[0]}'s password secret")
    check(secret and secret not in gw_secrets, f"compose.yaml: a gateway gets the authority store's password secret {secret}")
    return f"PostgreSQL service {dbs[0]}"


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
       "HorizontalPodAutoscaler": "autoscaling/v2", "Job": "batch/v1", "NetworkPolicy": "networking.k8s.io/v1",
       "PersistentVolumeClaim": "v1"}
# The containers that are the enclave's: they alone may mount its Secrets and its store.
ENCLAVE_SIDE = {"enclave", "enclave-init"}
DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def selects(selector, labels):
    return bool(selector) and selector.items() <= labels.items()


def pod_secrets(spec):
    """Every Secret a pod spec references: secret and projected volumes, env secretKeyRef, envFrom."""
    names = set()
    for v in spec.get("volumes", []):
        if "secret" in v:
            names.add(v["secret"].get("secretName"))
        for src in (v.get("projected") or {}).get("sources", []):
            if "secret" in src:
                names.add(src["secret"].get("name"))
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        for e in c.get("env", []):
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                names.add(ref.get("name"))
        for ef in c.get("envFrom", []):
            if "secretRef" in ef:
                names.add(ef["secretRef"].get("name"))
    return names


def container_port(containers, name, port):
    """The container port a Service/probe/policy port (name or number) reaches, or None."""
    for c in containers:
        for p in c.get("ports", []):
            if port in (p.get("name"), p.get("containerPort")):
                return p["containerPort"]
    return None


def lint_manifests(docs, values, variant, release, namespace):
    w = f"helm ({variant})"
    mode = values["enclave"]["mode"]
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
    deps = by_kind.get("Deployment", {})
    gw_name, enc_name = f"{release}-gateway", f"{release}-enclave"
    want = {gw_name} | ({enc_name} if mode == "deployment" else set())
    if not check(set(deps) == want, f"{w}: Deployments {sorted(deps)}, expected {sorted(want)} for enclave.mode {mode}"):
        return
    pods = {role: deps[n]["spec"]["template"] for role, n in (("gateway", gw_name), ("enclave", enc_name)) if n in deps}
    labels = {role: pod["metadata"].get("labels", {}) for role, pod in pods.items()}
    for role, pod in pods.items():
        dep = deps[gw_name if role == "gateway" else enc_name]
        sel = dep["spec"]["selector"]["matchLabels"]
        check(selects(sel, labels[role]), f"{w}: Deployment {dep['metadata']['name']} selector does not match its pod labels")
        for other in labels:
            if other != role:
                check(not selects(sel, labels[other]), f"{w}: Deployment {dep['metadata']['name']} also selects {other} pods")
    gw_dep, gw_pod = deps[gw_name], pods["gateway"]
    lint_gateway_pod(w, gw_pod["spec"], by_kind, values, mode, release, namespace)
    check(("replicas" in gw_dep["spec"]) != bool(values["autoscaling"]["enabled"]),
          f"{w}: Deployment replicas must be set exactly when the HPA is off")
    if mode == "deployment":
        enc_dep = deps[enc_name]
        check(enc_dep["spec"].get("replicas") == values["enclave"]["replicas"] and enc_dep["spec"].get("replicas", 0) >= 1,
              f"{w}: enclave Deployment replicas are not enclave.replicas")
        lint_enclave_pod(w + " enclave Deployment", pods["enclave"]["spec"], by_kind, values, release)
    # Services: each selects the pods of exactly one Deployment, and targets a port they have.
    svcs = by_kind.get("Service", {})
    want_svcs = {gw_name: "gateway"} | ({enc_name: "enclave"} if mode == "deployment" else {})
    check(set(svcs) == set(want_svcs), f"{w}: Services {sorted(svcs)}, expected {sorted(want_svcs)}")
    for sname, role in want_svcs.items():
        svc = svcs.get(sname)
        if not svc:
            continue
        check(selects(svc["spec"]["selector"], labels[role]), f"{w}: Service {sname} selects no {role} pod")
        for other in labels:
            if other != role:
                check(not selects(svc["spec"]["selector"], labels[other]), f"{w}: Service {sname} also selects {other} pods")
        ctrs = [c for c in pods[role]["spec"]["containers"] if c["name"] == role]
        for p in svc["spec"]["ports"]:
            check(container_port(ctrs, p.get("name"), p.get("targetPort")) is not None,
                  f"{w}: Service {sname} port {p.get('name')} targets {p.get('targetPort')}, no {role} container port")
    if mode == "deployment" and enc_name in svcs:
        lint_enclave_service(w, svcs[enc_name], pods, release, namespace)
    # PodDisruptionBudgets: one per Deployment when enabled, each selecting its own pods only.
    pdbs = list(by_kind.get("PodDisruptionBudget", {}).values())
    check(len(pdbs) == len(pods) * int(bool(values["podDisruptionBudget"]["enabled"])),
          f"{w}: {len(pdbs)} PodDisruptionBudgets; expected one per Deployment when enabled, none otherwise")
    covered = set()
    for pdb in pdbs:
        hit = {role for role, l in labels.items() if selects(pdb["spec"]["selector"]["matchLabels"], l)}
        check(len(hit) == 1, f"{w}: PDB {pdb['metadata']['name']} selects the pods of {sorted(hit) or 'no'} Deployment(s), not one")
        covered |= hit
        check(("minAvailable" in pdb["spec"]) != ("maxUnavailable" in pdb["spec"]), f"{w}: PDB needs exactly one bound")
    if pdbs:
        check(covered == set(pods), f"{w}: PDBs cover {sorted(covered)}, not every Deployment's pods {sorted(pods)}")
    # The NetworkPolicy: deployment mode only, when enabled.
    nps = list(by_kind.get("NetworkPolicy", {}).values())
    want_np = mode == "deployment" and bool(values["enclave"]["networkPolicy"]["enabled"])
    check(len(nps) == int(want_np), f"{w}: {len(nps)} NetworkPolicies, expected {int(want_np)}")
    for np_ in nps:
        if "enclave" in pods:
            lint_network_policy(w, np_, pods, labels)
    hpas = list(by_kind.get("HorizontalPodAutoscaler", {}).values())
    check(len(hpas) == int(bool(values["autoscaling"]["enabled"])), f"{w}: HPA present != enabled")
    for hpa in hpas:
        ref = hpa["spec"]["scaleTargetRef"]
        check(ref.get("kind") == "Deployment" and ref.get("name") == gw_name, f"{w}: HPA scales {ref}, not the gateways")
        check(1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"], f"{w}: HPA min/max replicas")
        for ctr in gw_pod["spec"]["containers"]:
            check(ctr.get("resources", {}).get("requests", {}).get("cpu"),
                  f"{w}: container {ctr['name']} has no CPU request, which the HPA's utilization needs")
    lint_authority_layout(w, by_kind, deps, pods, values, mode, release)
    jobs = list(by_kind.get("Job", {}).values())
    store = values["enclave"]["authorityStore"]["type"]
    check(len(jobs) == int(bool(values["enclave"]["initJob"]["enabled"]) and store == "postgres"),
          f"{w}: init Job present != enabled with the authority store on PostgreSQL (on a volume, init is the pod's init container)")
    for job in jobs:
        check("pre-install" in job["metadata"].get("annotations", {}).get("helm.sh/hook", ""), f"{w}: the init Job is no pre-install hook")
        spec = job["spec"]["template"]["spec"]
        check(spec.get("restartPolicy") in ("Never", "OnFailure"), f"{w}: Job restartPolicy")
        containers, volumes, mounted = lint_pod_common(w + " Job", spec, by_kind)
        if check(set(containers) == {"enclave-init"}, f"{w} Job: containers {sorted(containers)}, expected enclave-init alone"):
            lint_enclave_container(w + " Job", "enclave-init", containers, volumes, mounted, by_kind, values, release)
            check(containers["enclave-init"].get("args") == ["init"], f"{w} Job: enclave-init does not run `init`")
        allowed = {values["enclave"]["pinSecret"]} | extra_secrets(values) | authority_secrets(values)
        check(pod_secrets(spec) <= allowed, f"{w} Job: references Secrets {sorted(pod_secrets(spec) - allowed)} it has no use for")


def lint_authority_layout(w, by_kind, deps, pods, values, mode, release):
    """One authority store for every enclave container of the release (serving, init container,
    init Job); on a volume, exactly one enclave, its Deployment replaced rather than rolled, and the
    claim rendered (kept on uninstall) unless it is an existing one."""
    a = values["enclave"]["authorityStore"]
    urls = set()
    specs = [p["spec"] for p in pods.values()] + [j["spec"]["template"]["spec"] for j in by_kind.get("Job", {}).values()]
    for spec in specs:
        for c in spec.get("containers", []) + (spec.get("initContainers") or []):
            if c["name"] in ENCLAVE_SIDE:
                urls.add(next((e.get("value") for e in c.get("env", []) if e["name"] == "COFFER_AUTHORITY_STORE_URL"), None))
    check(len(urls) == 1 and None not in urls, f"{w}: the enclaves and init use authority stores {sorted(map(str, urls))}, not one")
    pvcs = by_kind.get("PersistentVolumeClaim", {})
    if a["type"] != "volume":
        check(not pvcs, f"{w}: PersistentVolumeClaims {sorted(pvcs)} with the authority store on PostgreSQL")
        return
    holder = deps[f"{release}-gateway" if mode == "sidecar" else f"{release}-enclave"]
    scaled = any(h["spec"]["scaleTargetRef"].get("name") == holder["metadata"]["name"]
                 for h in by_kind.get("HorizontalPodAutoscaler", {}).values())
    check(holder["spec"].get("replicas") == 1 and not scaled,
          f"{w}: the authority store is one enclave's volume, but Deployment {holder['metadata']['name']} may run more than one pod")
    check(holder["spec"].get("strategy", {}).get("type") == "Recreate",
          f"{w}: Deployment {holder['metadata']['name']} holds the authority store's volume and is rolled, not recreated")
    claim = a["volume"]["existingClaim"]
    if claim:
        check(not pvcs, f"{w}: a PersistentVolumeClaim rendered beside existingClaim {claim}")
        return
    name = f"{release}-enclave-authority"
    if check(set(pvcs) == {name}, f"{w}: PersistentVolumeClaims {sorted(pvcs)}, expected {name}"):
        pvc = pvcs[name]
        check(pvc["metadata"].get("annotations", {}).get("helm.sh/resource-policy") == "keep",
              f"{w}: PersistentVolumeClaim {name} is not kept by helm uninstall")
        check(pvc["spec"].get("accessModes") == [a["volume"]["accessMode"]]
              and pvc["spec"]["resources"]["requests"].get("storage") == a["volume"]["size"]
              and pvc["spec"].get("storageClassName", "") == a["volume"]["storageClassName"],
              f"{w}: PersistentVolumeClaim {name} does not follow enclave.authorityStore.volume")
        check("helm.sh/hook" not in pvc["metadata"].get("annotations", {}), f"{w}: PersistentVolumeClaim {name} is a hook")


def extra_secrets(values):
    return {v["secret"].get("secretName") for v in values.get("extraVolumes") or [] if "secret" in v}


def authority_secrets(values):
    a = values["enclave"]["authorityStore"]
    return {a["postgres"]["passwordSecret"]} if a["type"] == "postgres" else set()


def lint_init_container(w, spec, volumes, mounted, by_kind, values, release):
    """The pod holding the one enclave on an authority store volume runs `coffer-enclave init`
    first, as its init container (only this pod can mount the volume); no other pod has one."""
    inits = {c["name"]: c for c in spec.get("initContainers") or []}
    want = values["enclave"]["authorityStore"]["type"] == "volume" and bool(values["enclave"]["initJob"]["enabled"])
    if check(set(inits) == ({"enclave-init"} if want else set()),
             f"{w}: init containers {sorted(inits)}; expected enclave-init exactly with an authority store volume and init enabled"):
        if want:
            check(inits["enclave-init"].get("args") == ["init"], f"{w}: enclave-init does not run `init`")
            lint_enclave_container(w, "enclave-init", inits, volumes, mounted, by_kind, values, release)


# Fields of the Kubernetes API this chart may use; a misindented template puts keys elsewhere.
POD_FIELDS = {"containers", "initContainers", "volumes", "securityContext", "automountServiceAccountToken",
              "restartPolicy", "nodeSelector", "tolerations", "affinity", "serviceAccountName",
              "topologySpreadConstraints", "terminationGracePeriodSeconds", "priorityClassName"}
CONTAINER_FIELDS = {"name", "image", "imagePullPolicy", "command", "args", "env", "envFrom", "ports",
                    "readinessProbe", "livenessProbe", "startupProbe", "volumeMounts", "resources",
                    "securityContext", "workingDir", "lifecycle"}


def lint_pod_common(w, spec, by_kind):
    """Fields, securityContexts, mounts. Returns containers by name, volumes by name, and
    mounted = {volume: [(container, mountPath, readOnly)]}."""
    check(set(spec) <= POD_FIELDS, f"{w}: unknown pod spec fields {sorted(set(spec) - POD_FIELDS)}")
    inits = spec.get("initContainers") or []
    # The only init container is the enclave's `init` beside an authority store volume (checked by
    # lint_manifests); its mounts and securityContext are checked here with the others'.
    check(all(c.get("name") == "enclave-init" for c in inits), f"{w}: init containers other than enclave-init")
    for c in spec.get("containers", []) + inits:
        check(set(c) <= CONTAINER_FIELDS, f"{w}: unknown container fields {sorted(set(c) - CONTAINER_FIELDS)}")
        check(isinstance(c.get("resources", {}), dict), f"{w}: {c.get('name')}: resources is empty")
    containers = {c["name"]: c for c in spec.get("containers", [])}
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    check(spec.get("automountServiceAccountToken") is False, f"{w}: pods get a service account token they never use")
    mounted = {}
    for c in list(containers.values()) + inits:
        check(c.get("image"), f"{w}: container {c['name']} has no image")
        for m in c.get("volumeMounts", []):
            check(m["name"] in volumes, f"{w}: {c['name']} mounts undeclared volume {m['name']}")
            mounted.setdefault(m["name"], []).append((c["name"], m["mountPath"], m.get("readOnly") is True))
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
    return containers, volumes, mounted


def container_env(c, by_kind):
    """{name: env entry} and the names its ConfigMaps (envFrom) add."""
    env = {e["name"]: e for e in c.get("env", [])}
    keys = set()
    for ef in c.get("envFrom", []):
        keys |= set((by_kind.get("ConfigMap", {}).get(ef["configMapRef"]["name"], {}).get("data") or {}))
    return env, keys


def secret_file(w, path, owner, volumes, mounted, secret, key, what):
    """`path` is a file of Secret `secret`'s `key`, on a volume only `owner` mounts, read-only."""
    hits = [(n, mp) for n, v in volumes.items() if "secret" in v
            for c, mp, _ in mounted.get(n, []) if c == owner and under(path or "", mp)]
    if not check(path and hits, f"{w}: {what} {path!r} is on no Secret volume of the {owner} container"):
        return
    name, mp = hits[0]
    vol = volumes[name]["secret"]
    check(vol.get("secretName") == secret, f"{w}: {what} comes from Secret {vol.get('secretName')}, not {secret}")
    items = {i["path"]: i["key"] for i in vol.get("items", [])}
    rel = os.path.relpath(path, mp)
    check(items.get(rel, rel if not vol.get("items") else None) == key, f"{w}: {what} is not key {key} of Secret {secret}")
    side = ENCLAVE_SIDE if owner in ENCLAVE_SIDE else {owner}
    check({c for c, _, _ in mounted[name]} <= side, f"{w}: the Secret volume of {what} is mounted outside the {owner} container")
    check(all(ro for _, _, ro in mounted[name]), f"{w}: the Secret volume of {what} is mounted writable")


def lint_enclave_container(w, name, containers, volumes, mounted, by_kind, values, release):
    """An enclave (serving, its init container, or the init Job): environment, module, the PIN as
    a file, and the authority store."""
    env, keys = container_env(containers[name], by_kind)
    check(not [e for e in env.values() if (e.get("valueFrom") or {}).get("secretKeyRef")]
          and not [ef for ef in containers[name].get("envFrom", []) if "secretRef" in ef],
          f"{w}: {name} takes a Secret into its environment (the database URL?); its secrets are files")
    check_env(f"{w}: {name}", "enclave", {**{k: "" for k in keys}, **{k: e.get("value") for k, e in env.items()}})
    check(env.get("COFFER_PKCS11_MODULE", {}).get("value") == values["enclave"]["pkcs11Module"], f"{w}: PKCS#11 module not from values")
    secret_file(w, env.get("COFFER_HSM_PIN_FILE", {}).get("value"), name, volumes, mounted,
                values["enclave"]["pinSecret"], values["enclave"]["pinKey"], "COFFER_HSM_PIN_FILE")
    lint_authority_store(w, name, env, volumes, mounted, values, release)
    return env


def lint_authority_store(w, name, env, volumes, mounted, values, release):
    """COFFER_AUTHORITY_STORE_URL set by the chart (never the default beside the socket, on the
    socket's memory emptyDir): PostgreSQL with the password as a file of its Secret, or SQLite on
    a writable mount of the authority store's claim, which only the enclave's containers mount."""
    a = values["enclave"]["authorityStore"]
    url = env.get("COFFER_AUTHORITY_STORE_URL", {}).get("value") or ""
    pvcs = {n: v["persistentVolumeClaim"].get("claimName") for n, v in volumes.items() if "persistentVolumeClaim" in v}
    if a["type"] == "postgres":
        u = urlsplit(url)
        check(url == a["postgres"]["url"] and u.scheme in ("postgres", "postgresql") and u.password is None,
              f"{w}: {name}: COFFER_AUTHORITY_STORE_URL {url!r} is not enclave.authorityStore.postgres.url (postgres://, no password)")
        secret_file(w, env.get("COFFER_AUTHORITY_STORE_PASSWORD_FILE", {}).get("value"), name, volumes, mounted,
                    a["postgres"]["passwordSecret"], a["postgres"]["passwordKey"], "COFFER_AUTHORITY_STORE_PASSWORD_FILE")
        check(not pvcs, f"{w}: a PersistentVolumeClaim in the pod while the authority store is PostgreSQL")
        return
    claim = a["volume"]["existingClaim"] or f"{release}-enclave-authority"
    path = url[len("sqlite://"):] if url.startswith("sqlite:///") else ""
    check(path, f"{w}: {name}: COFFER_AUTHORITY_STORE_URL {url!r} is not sqlite:///PATH")
    hits = [n for n, c in pvcs.items() if c == claim and any(who == name and under(path, mp) and not ro
                                                            for who, mp, ro in mounted.get(n, []))]
    check(path and hits, f"{w}: {name}: the SQLite authority store {path!r} is on no writable mount of the claim {claim}")
    for n in pvcs:
        check({who for who, _, _ in mounted.get(n, [])} <= ENCLAVE_SIDE,
              f"{w}: the authority store's volume {n} is mounted outside the enclave's containers")
    check("COFFER_AUTHORITY_STORE_PASSWORD_FILE" not in env, f"{w}: {name}: a password file for a SQLite authority store")


def lint_gateway_container(w, gw, by_kind, values):
    genv, gkeys = container_env(gw, by_kind)
    check_env(f"{w}: gateway", "gateway", {**{k: "" for k in gkeys}, **{k: e.get("value") for k, e in genv.items()}})
    store = genv.get("COFFER_STORE_URL", {}).get("valueFrom", {}).get("secretKeyRef", {})
    check(store.get("name") == values["database"]["existingSecret"] and store.get("key") == values["database"]["urlKey"],
          f"{w}: COFFER_STORE_URL does not come from database.existingSecret")
    # Probes on the ops listener, paths as specified.
    ports = {p["name"]: p["containerPort"] for p in gw.get("ports", [])}
    check(ports.get("http") == port_of(genv.get("COFFER_LISTEN", {}).get("value", ":0")), f"{w}: port http is not COFFER_LISTEN's")
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        hg = gw.get(probe, {}).get("httpGet", {})
        check(hg.get("path") == path, f"{w}: gateway {probe} is not GET {path}")
        port = ports.get(hg.get("port"), hg.get("port"))
        check(port == port_of(genv.get("COFFER_OPS_LISTEN", {}).get("value", ":0")), f"{w}: gateway {probe} is not on COFFER_OPS_LISTEN")
    return genv


def lint_gateway_pod(w, spec, by_kind, values, mode, release, namespace):
    containers, volumes, mounted = lint_pod_common(w, spec, by_kind)
    want = {"gateway", "enclave"} if mode == "sidecar" else {"gateway"}
    if not check(set(containers) == want, f"{w}: gateway pod containers {sorted(containers)}, expected {sorted(want)} (enclave.mode {mode})"):
        return
    genv = lint_gateway_container(w, containers["gateway"], by_kind, values)
    database, pin = values["database"]["existingSecret"], values["enclave"]["pinSecret"]
    enc_tls, gw_tls = values["enclave"]["tls"]["existingSecret"], values["gateway"]["enclaveTls"]["existingSecret"]
    tls_env = {"COFFER_ENCLAVE_URLS", "COFFER_ENCLAVE_CLIENT_TLS_CA", "COFFER_ENCLAVE_CLIENT_TLS_CERT", "COFFER_ENCLAVE_CLIENT_TLS_KEY"}
    if mode == "sidecar":
        check(not (tls_env & set(genv)), f"{w}: sidecar gateway has {sorted(tls_env & set(genv))}")
        allowed = {database, pin} | extra_secrets(values) | authority_secrets(values)
        check(pod_secrets(spec) <= allowed, f"{w}: gateway pod references Secrets {sorted(pod_secrets(spec) - allowed)}")
        lint_init_container(w, spec, volumes, mounted, by_kind, values, release)
        env = lint_enclave_container(w, "enclave", containers, volumes, mounted, by_kind, values, release)
        check(not {k for k in env if k.startswith("COFFER_ENCLAVE_TLS") or k == "COFFER_ENCLAVE_TCP_LISTEN"},
              f"{w}: the sidecar enclave listens on TCP")
        # The socket: same path in both, on an emptyDir both mount.
        gsock, esock = genv.get("COFFER_ENCLAVE_SOCKET", {}).get("value"), env.get("COFFER_ENCLAVE_SOCKET", {}).get("value")
        check(gsock and gsock == esock, f"{w}: gateway and enclave name different sockets ({gsock}, {esock})")
        shared = [n for n, v in volumes.items() if "emptyDir" in v
                  and {c for c, p, _ in mounted.get(n, []) if gsock and under(gsock, p)} == {"gateway", "enclave"}]
        check(shared, f"{w}: no emptyDir holds the socket for both containers")
        return
    # deployment mode: the gateway alone, nothing of the enclave's, its client TLS files.
    check(not {"COFFER_ENCLAVE_SOCKET", "COFFER_ENCLAVE_SOCKETS"} & set(genv),
          f"{w}: gateway without an enclave container still names a socket")
    check(not [n for n, v in volumes.items() if "emptyDir" in v], f"{w}: gateway pod has an emptyDir (the socket volume)")
    check(not spec.get("initContainers") and not [n for n, v in volumes.items() if "persistentVolumeClaim" in v],
          f"{w}: gateway pod without an enclave has an init container or a PersistentVolumeClaim")
    allowed = {database, gw_tls}
    check(pod_secrets(spec) <= allowed, f"{w}: gateway pod references Secrets {sorted(pod_secrets(spec) - allowed)}"
          f" (only {sorted(allowed)}: never the PIN, the enclave's key or the enclave's extraVolumes)")
    check(gw_tls in pod_secrets(spec), f"{w}: gateway pod does not mount gateway.enclaveTls.existingSecret")
    t = values["gateway"]["enclaveTls"]
    for var, key in (("CA", t["caKey"]), ("CERT", t["certKey"]), ("KEY", t["keyKey"])):
        secret_file(w, genv.get(f"COFFER_ENCLAVE_CLIENT_TLS_{var}", {}).get("value"), "gateway", volumes, mounted,
                    gw_tls, key, f"COFFER_ENCLAVE_CLIENT_TLS_{var}")
    urls = [u.strip() for u in (genv.get("COFFER_ENCLAVE_URLS", {}).get("value") or "").split(",") if u.strip()]
    check(urls, f"{w}: gateway has no COFFER_ENCLAVE_URLS")
    for u in urls:
        p = urlsplit(u)
        check(p.scheme == "https" and p.hostname == f"{release}-enclave.{namespace}.svc" and p.port == 7443
              and p.path in ("", "/"), f"{w}: COFFER_ENCLAVE_URLS {u} is not https://{release}-enclave.{namespace}.svc:7443")


def lint_enclave_pod(w, spec, by_kind, values, release):
    containers, volumes, mounted = lint_pod_common(w, spec, by_kind)
    if not check(set(containers) == {"enclave"}, f"{w}: containers {sorted(containers)}, expected enclave alone"):
        return
    enc = containers["enclave"]
    env = lint_enclave_container(w, "enclave", containers, volumes, mounted, by_kind, values, release)
    lint_init_container(w, spec, volumes, mounted, by_kind, values, release)
    t, gw_tls = values["enclave"]["tls"], values["gateway"]["enclaveTls"]["existingSecret"]
    allowed = {values["enclave"]["pinSecret"], t["existingSecret"]} | extra_secrets(values) | authority_secrets(values)
    check(pod_secrets(spec) <= allowed, f"{w}: enclave pod references Secrets {sorted(pod_secrets(spec) - allowed)}"
          f" (never the gateway's client key {gw_tls} or the database URL)")
    for var, key in (("CERT", t["certKey"]), ("KEY", t["keyKey"]), ("CLIENT_CA", t["clientCaKey"])):
        secret_file(w, env.get(f"COFFER_ENCLAVE_TLS_{var}", {}).get("value"), "enclave", volumes, mounted,
                    t["existingSecret"], key, f"COFFER_ENCLAVE_TLS_{var}")
    listen = env.get("COFFER_ENCLAVE_TCP_LISTEN", {}).get("value", ":0")
    ports = {p.get("name"): p["containerPort"] for p in enc.get("ports", [])}
    check(port_of(listen) == 7443 and 7443 in ports.values(),
          f"{w}: COFFER_ENCLAVE_TCP_LISTEN {listen} is not a container port 7443")
    for probe in ("readinessProbe", "livenessProbe"):
        ts = enc.get(probe, {}).get("tcpSocket", {}).get("port")
        check(ports.get(ts, ts) == port_of(listen), f"{w}: enclave {probe} is not a TCP probe on COFFER_ENCLAVE_TCP_LISTEN's port")
    # Its own socket, on an emptyDir only it mounts, writable (it creates the socket there).
    sock = env.get("COFFER_ENCLAVE_SOCKET", {}).get("value", "")
    holders = [n for n, v in volumes.items() if "emptyDir" in v
               and any(c == "enclave" and under(sock, p) and not ro for c, p, ro in mounted.get(n, []))]
    check(sock.startswith("/") and holders, f"{w}: COFFER_ENCLAVE_SOCKET {sock!r} is on no writable emptyDir (read-only root)")
    check(enc.get("resources", {}).get("requests"), f"{w}: enclave has no resource requests")


def lint_enclave_service(w, svc, pods, release, namespace):
    check(svc["spec"].get("type", "ClusterIP") == "ClusterIP" and svc["spec"].get("clusterIP") != "None",
          f"{w}: the enclave Service is not a ClusterIP Service")
    enc = [c for c in pods["enclave"]["spec"]["containers"] if c["name"] == "enclave"]
    env = {e["name"]: e.get("value") for c in enc for e in c.get("env", [])}
    ports = {p.get("port"): p for p in svc["spec"]["ports"]}
    check(set(ports) == {7443}, f"{w}: enclave Service ports {sorted(ports)}, expected 7443 (the gateways' URL)")
    p = ports.get(7443, {})
    check(container_port(enc, None, p.get("targetPort")) == port_of(env.get("COFFER_ENCLAVE_TCP_LISTEN") or ":0"),
          f"{w}: enclave Service port 7443 does not reach COFFER_ENCLAVE_TCP_LISTEN's port")
    check(p.get("protocol", "TCP") == "TCP", f"{w}: enclave Service port is not TCP")


def lint_network_policy(w, np_, pods, labels):
    name = np_["metadata"]["name"]
    sel = np_["spec"].get("podSelector", {})
    check(set(sel) == {"matchLabels"} and selects(sel["matchLabels"], labels["enclave"])
          and not selects(sel["matchLabels"], labels["gateway"]), f"{w}: NetworkPolicy {name} does not select the enclave pods alone")
    check("Ingress" in np_["spec"].get("policyTypes", []), f"{w}: NetworkPolicy {name} has no Ingress policy type")
    rules = np_["spec"].get("ingress") or []
    check(rules, f"{w}: NetworkPolicy {name} admits nobody, not even the gateways")
    enc = [c for c in pods["enclave"]["spec"]["containers"] if c["name"] == "enclave"]
    for r in rules:
        peers = r.get("from") or []
        check(peers, f"{w}: NetworkPolicy {name}: a rule without `from` admits every source")
        for peer in peers:
            ps = peer.get("podSelector", {})
            check(set(peer) == {"podSelector"} and set(ps) == {"matchLabels"} and selects(ps["matchLabels"], labels["gateway"])
                  and not selects(ps["matchLabels"], labels["enclave"]),
                  f"{w}: NetworkPolicy {name}: a peer other than this release's gateway pods: {peer}")
        ports = r.get("ports") or []
        check(ports, f"{w}: NetworkPolicy {name}: a rule without ports admits every port")
        for p in ports:
            check(p.get("protocol", "TCP") == "TCP" and container_port(enc, None, p.get("port")) == 7443,
                  f"{w}: NetworkPolicy {name}: port {p} is not the enclave's TLS port 7443")


def lint_renderer():
    """helm_render.py itself: what it must render, and what it must refuse rather than guess."""
    scope = {"Values": {"m": "deployment", "n": 2, "b": True}, "Release": {"Name": "r", "Namespace": "ns"}}

    def render(t):
        return helm_render.Renderer(scope).render(helm_render.parse(helm_render.tokenize(t, "self-test")))
    for t, want in (('{{ if eq .Values.m "deployment" }}A{{ else }}B{{ end }}', "A"),
                    ('{{ if ne .Values.m "deployment" }}A{{ else }}B{{ end }}', "B"),
                    ('{{ if eq .Values.b true }}A{{ end }}', "A"),
                    ('{{ .Values.m | eq "sidecar" }}', "false"),
                    ('{{ if .Values.n | int | lt 1 }}A{{ else }}B{{ end }}', "A"),
                    ('{{ if .Values.n | int | lt 2 }}A{{ else }}B{{ end }}', "B"),
                    ('{{ .Values.n | int | gt 3 }}', "true"),
                    ('{{ .Release.Name }}-enclave.{{ .Release.Namespace }}.svc', "r-enclave.ns.svc")):
        try:
            got = render(t)
        except helm_render.RenderError as e:
            got = f"error {e}"
        check(got == want, f"helm_render.py: {t} renders {got!r}, not {want!r}")
    # Helm would fail on these (float64 values against int literals, mixed types), or they are
    # outside the subset: the renderer must refuse them too.
    for t in ('{{ eq .Values.n 2 }}', '{{ eq 1 1 }}', '{{ eq .Values.m 1 }}', '{{ eq .Values.b "true" }}',
              '{{ fail "stop" }}', '{{ eq .Values.m }}', '{{ range .Values.m }}x{{ end }}', '{{ if eq (.Values.m) "x" }}{{ end }}',
              '{{ .Values.missing }}', '{{ else if .Values.b }}', '{{ lt .Values.n 1 }}', '{{ .Values.n | lt 1 }}',
              '{{ .Values.b | int }}', '{{ .Values.m | int }}', '{{ lt .Values.m "x" }}'):
        try:
            render(t)
            check(False, f"helm_render.py: renders {t}, which it must refuse")
        except helm_render.RenderError:
            pass
    try:
        render('{{ fail "stop here" }}')
    except helm_render.RenderError as e:
        check("fail: stop here" in str(e), f"helm_render.py: fail does not report its message: {e}")


def says_san(text, dns):
    """`dns` named within 60 characters of the word SAN (the statement that the SAN must hold it)."""
    return any("SAN" in text[max(0, m.start() - 60):m.end() + 60] for m in re.finditer(re.escape(dns), text))


def lint_helm():
    lint_renderer()
    chart = os.path.join(DEPLOY, "helm", "coffer")
    meta = yaml.safe_load(read(os.path.join(chart, "Chart.yaml")))
    check(meta.get("apiVersion") == "v2" and meta.get("name") and meta.get("version"), "Chart.yaml: apiVersion v2, name, version")
    base = helm_render.load_values(chart)
    for path, v in walk(base):
        if isinstance(v, str):
            check(not re.search(r"://[^/@\s]*:[^/@\s]*@", v), f"values.yaml: {path} holds a URL with a password")
            check(not re.search(r"(pin|password|url)$", path, re.I) or not v, f"values.yaml: {path} holds a value; name a Secret instead")
            check("-----BEGIN" not in v, f"values.yaml: {path} holds PEM material; name a Secret instead")
    check(base["enclave"]["mode"] == "sidecar", "values.yaml: enclave.mode must default to sidecar (today's topology)")
    check(base["enclave"]["replicas"] == 2, "values.yaml: enclave.replicas must default to 2")
    check(base["enclave"]["networkPolicy"]["enabled"] is True, "values.yaml: enclave.networkPolicy.enabled must default to true")
    check(base["enclave"]["authorityStore"]["type"] == "postgres",
          "values.yaml: enclave.authorityStore.type must default to postgres (the default layout runs several enclaves)")
    try:
        helm_render.render_chart(chart, base)
        check(False, "helm: the default values render, but enclave.pkcs11Module must be required")
    except helm_render.RenderError as e:
        check("pkcs11Module" in str(e), f"helm: default values fail for another reason: {e}")
    lint_values = os.path.join(chart, "ci", "lint-values.yaml")
    dep = {"mode": "deployment"}
    vol = {"authorityStore": {"type": "volume"}}
    try:
        helm_render.render_chart(chart, helm_render.load_values(
            chart, [lint_values], {"enclave": {"authorityStore": {"postgres": {"url": ""}}}}))
        check(False, "helm: renders without enclave.authorityStore.postgres.url, which type postgres requires")
    except helm_render.RenderError as e:
        check("required: enclave.authorityStore.postgres.url" in str(e), f"helm: a missing authority store URL refused for another reason: {e}")
    # Values the chart must refuse: (override, what the error names).
    refused = {
        "enclave.mode unknown": ({"enclave": {"mode": "sidecars"}}, "enclave.mode"),
        "gateway TLS Secret = enclave TLS Secret": (
            {"enclave": dep, "gateway": {"enclaveTls": {"existingSecret": base["enclave"]["tls"]["existingSecret"]}}},
            "enclave.tls.existingSecret"),
        "gateway TLS Secret = PIN Secret": (
            {"enclave": dep, "gateway": {"enclaveTls": {"existingSecret": base["enclave"]["pinSecret"]}}}, "pinSecret"),
        "enclave.authorityStore.type unknown": ({"enclave": {"authorityStore": {"type": "sqlite"}}}, "enclave.authorityStore.type"),
        # A store of its own per enclave: the second would refuse the organizations the first has.
        "authority store volume, 2 enclave pods": ({"enclave": dict(dep, **vol, replicas=2)}, "enclave.replicas"),
        "authority store volume, sidecar with the HPA": ({"enclave": vol}, "autoscaling.enabled"),
        "authority store volume, sidecar with 2 gateway pods": (
            {"enclave": vol, "autoscaling": {"enabled": False}, "gateway": {"replicas": 2}}, "gateway.replicas"),
    }
    for what, (override, needle) in refused.items():
        try:
            helm_render.render_chart(chart, helm_render.load_values(chart, [lint_values], override))
            check(False, f"helm: renders with {what}, which it must refuse")
        except helm_render.RenderError as e:
            check("fail: " in str(e) and needle in str(e), f"helm: {what} refused for another reason than the chart's `fail`: {e}")
    # Each switch on and off somewhere, no two switches alike in every set, every optional block
    # filled, both enclave modes; (override, release name, namespace).
    every_optional = {
        "enclave": {"extraVolumeMounts": [{"name": "luna", "mountPath": "/etc/luna"}]},
        "extraVolumes": [{"name": "luna", "secret": {"secretName": "luna-client"}}],
        "nodeSelector": {"hsm": "luna"}, "tolerations": [{"key": "hsm", "operator": "Exists"}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
    }
    variants = {
        "ci/lint-values.yaml": ({}, "coffer", "default"),
        "PDB off": ({"podDisruptionBudget": {"enabled": False}}, "coffer", "default"),
        "init Job off": ({"enclave": {"initJob": {"enabled": False}}}, "coffer", "default"),
        "HPA off, every optional list and map set": (dict(every_optional, autoscaling={"enabled": False}), "coffer", "default"),
        "deployment mode": ({"enclave": dep}, "acme", "vault"),
        "deployment mode, PDB, NetworkPolicy and init Job off": (
            {"enclave": dict(dep, networkPolicy={"enabled": False}, initJob={"enabled": False}),
             "podDisruptionBudget": {"enabled": False}}, "coffer", "default"),
        "deployment mode, HPA off, every optional list and map set, 3 enclaves": (
            helm_render.merge(every_optional, {"enclave": dict(dep, replicas=3), "autoscaling": {"enabled": False}}),
            "coffer", "hsm"),
        "sidecar, one gateway pod, authority store on the chart's volume, every optional list and map set": (
            helm_render.merge(every_optional, {"enclave": vol, "autoscaling": {"enabled": False}, "gateway": {"replicas": 1}}),
            "solo", "default"),
        "deployment mode, one enclave, authority store on an existing claim": (
            {"enclave": dict(dep, replicas=1, authorityStore={"type": "volume", "volume": {
                "existingClaim": "coffer-authority", "storageClassName": "fast"}})}, "coffer", "vault"),
        "deployment mode, one enclave, authority store volume, init and PDB off": (
            {"enclave": dict(dep, replicas=1, initJob={"enabled": False}, authorityStore={"type": "volume", "volume": {
                "storageClassName": "fast", "accessMode": "ReadWriteOncePod"}}),
             "podDisruptionBudget": {"enabled": False}}, "acme", "default"),
    }
    for variant, (override, release, namespace) in variants.items():
        values = helm_render.load_values(chart, [lint_values], override)
        try:
            rendered = helm_render.render_chart(chart, values, release, namespace)
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
            lint_manifests(docs, values, variant, release, namespace)
        except (KeyError, TypeError, AttributeError, IndexError, ValueError) as e:
            check(False, f"helm ({variant}): a manifest lacks a field or has the wrong shape: {e!r}")
        check(not re.search(r"not\s+in\s+this\s+chart", notes, re.I), f"NOTES.txt ({variant}): still says something is not in this chart")
        if values["enclave"]["mode"] == "deployment":
            dns = f"{release}-enclave.{namespace}.svc"
            check(says_san(notes, dns) and re.search(r"TCP\s+with\s+mutual\s+TLS", notes)
                  and values["enclave"]["tls"]["existingSecret"] in notes
                  and values["gateway"]["enclaveTls"]["existingSecret"] in notes,
                  f"NOTES.txt ({variant}): must name the enclave Service {dns}, that its SAN must include it, and both TLS Secrets")
        else:
            check("enclave.mode=deployment" in notes and re.search(r"TCP\s+with\s+mutual\s+TLS", notes),
                  f"NOTES.txt ({variant}): must point at enclave.mode=deployment (TCP with mutual TLS)")
    readme = read(os.path.join(chart, "README.md"))
    check(not re.search(r"not\s+in\s+this\s+chart", readme, re.I), "helm/coffer/README.md: still says the enclave Deployment is not in this chart")
    for doc, text in (("helm/coffer/README.md", readme), ("deploy/README.md", read(os.path.join(DEPLOY, "README.md")))):
        check(not re.search(r"in-memory\s+replay", text, re.I), f"{doc}: still speaks of an enclave's in-memory replay window")
        check("COFFER_AUTHORITY_STORE_URL" in text and "enclave.authorityStore" in text,
              f"{doc}: must describe the authority store's values (enclave.authorityStore, COFFER_AUTHORITY_STORE_URL)")
    check(all(s in readme for s in ("enclave.mode", "`sidecar`", "`deployment`"))
          and says_san(readme, "<release>-enclave.<namespace>.svc") and re.search(r"TCP\s+with\s+mutual\s+TLS", readme),
          "helm/coffer/README.md: must describe both enclave.mode values and that the server certificate's SAN"
          " must include <release>-enclave.<namespace>.svc")
    deploy_readme = read(os.path.join(DEPLOY, "README.md"))
    check("enclave.mode" in deploy_readme and says_san(deploy_readme, "<release>-enclave.<namespace>.svc")
          and not re.search(r"does\s+not\s+template|not\s+in\s+this\s+chart", deploy_readme),
          "deploy/README.md: must describe enclave.mode and the SAN <release>-enclave.<namespace>.svc, and no longer say"
          " the chart does not template the enclave Deployment")
    print(f"  helm/coffer: rendered {len(variants)} value sets in both enclave modes and both authority stores (the"
          f" defaults must fail on enclave.pkcs11Module, {len(refused)} bad sets must be refused, a PostgreSQL store"
          f" needs its URL); kinds, apiVersions, selectors, Services, PDBs, NetworkPolicy, enclave URL, probes, socket,"
          f" PIN, TLS Secrets, securityContexts, one authority store for every enclave and init, its password or volume")


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
