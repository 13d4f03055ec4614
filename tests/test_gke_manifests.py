"""The Kubernetes manifests of deploy/gke/ (docs/gke.md), checked offline: every YAML document
against a schema (Kubernetes' own kinds with kubernetes-validate, whose bundled schemas of the
API are strict: an unknown field fails; the JobSet with the project's schema of JobSet's v1alpha2
API, deploy/gke/schemas/, and each of its Job templates again with kubernetes-validate as a
batch/v1 Job); then what no schema sees: resource quantities, TPU chips against the slice's
topology, node selectors, torchrun's node count, rank and rendezvous address against the Job or
JobSet, and the examples the pods run and the flags they are given. A broken copy of a manifest
must fail. Nothing is fetched, and no cluster is needed."""

import ast
import copy
import json
import math
import pathlib
import re
import shlex

import jsonschema
import kubernetes_validate  # installed by `make setup`: missing, this module fails (it is not skipped)
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
GKE = ROOT / "deploy" / "gke"
# The Kubernetes version whose schemas the manifests are checked against (kubernetes-validate
# bundles each minor version's): a version GKE's release channels serve.
K8S_VERSION = "1.33"
JOBSET_SCHEMA = json.loads((GKE / "schemas" / "jobset-v1alpha2.json").read_text())
# Each manifest and what it runs on: "tpu" or "cpu". A new manifest must be listed here.
MANIFESTS = {"single-host-v5e.yaml": "tpu", "multi-host-jobset.yaml": "tpu", "cpu-only.yaml": "cpu"}
# GKE's TPU node labels, and the chips of one host that a pod may ask for on each accelerator:
# a single-host v5e slice is a node of 1, 4 or 8 chips, a multi-host one is made of 4-chip hosts.
ACCELERATOR, TOPOLOGY, TPU = (
    "cloud.google.com/gke-tpu-accelerator",
    "cloud.google.com/gke-tpu-topology",
    "google.com/tpu",
)
CHIPS_PER_HOST = {"tpu-v5-lite-podslice": {"single": (1, 4, 8), "multi": (4,)}}
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
# A Kubernetes resource quantity: a signed decimal number, then a binary or decimal SI suffix
# or a decimal exponent (the bundled schema takes any string)
QUANTITY = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?$")


class ManifestError(Exception):
    """What a schema cannot see is wrong in a manifest."""


def documents(path):
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def as_job(template, name):
    """A JobSet's Job template as the batch/v1 Job JobSet makes of it."""
    meta = dict(template.get("metadata") or {}, name=name)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": template.get("spec")}


def validate(doc):
    """Checks one document against its kind's schema; raises jsonschema.ValidationError
    (kubernetes-validate's errors are ones) or, for a kind no schema is known for,
    kubernetes_validate's SchemaNotFoundError."""
    if doc.get("apiVersion") == "jobset.x-k8s.io/v1alpha2":
        jsonschema.Draft202012Validator(JOBSET_SCHEMA).validate(doc)
        for rj in doc["spec"]["replicatedJobs"]:
            name = f"{doc['metadata']['name']}-{rj['name']}-0"
            kubernetes_validate.validate(as_job(rj["template"], name), K8S_VERSION, strict=True)
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def workloads(doc):
    """(name, replicas, Job spec, replicated job or None) of each Job a document makes."""
    if doc["kind"] == "Job":
        yield doc["metadata"]["name"], 1, doc["spec"], None
    elif doc["kind"] == "JobSet":
        for rj in doc["spec"]["replicatedJobs"]:
            yield f"{doc['metadata']['name']}/{rj['name']}", rj.get("replicas", 1), rj["template"]["spec"], rj


def shell_commands(script):
    """The simple commands of a shell script, each a list of its words (quotes removed,
    variables not expanded): commands end at a new line, ';', '&&', '||' or '|'."""
    lines = [line for line in script.replace("\\\n", " ").splitlines() if not line.lstrip().startswith("#")]
    lex = shlex.shlex("\n".join(lines), posix=True, punctuation_chars=";&|\n")
    lex.whitespace, lex.whitespace_split, lex.commenters = " \t\r", True, ""
    commands, words = [], []
    for word in lex:
        if set(word) <= set(";&|\n"):
            commands, words = commands + [words] * bool(words), []
        else:
            words.append(word)
    return commands + [words] * bool(words)


def container_commands(container):
    """The commands a container runs: those of its `bash -c` script, else its command line."""
    argv = list(container.get("command") or []) + list(container.get("args") or [])
    if argv[:2] in (["bash", "-c"], ["sh", "-c"]):
        return shell_commands(argv[2])
    return [argv]


def expand(word, env):
    """$VAR and ${VAR} in a word: the container's value of VAR; "0" for a value the pod gets at
    run time (the downward API), which stands for any index."""

    def value(m):
        var = env.get(m.group(1) or m.group(2))
        return var.get("value", "") if var and "value" in var else "0"

    return re.sub(r"\$(?:\{(\w+)\}|(\w+))", value, word)


def example_options(path):
    """{option: its default} of an example's argparse options, read from its source."""
    options = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            for arg in node.args:
                if isinstance(arg, ast.Constant) and str(arg.value).startswith("-"):
                    options[arg.value] = default.value if isinstance(default, ast.Constant) else None
    return options


def examples_run(words):
    """(example path, its arguments) of each `python examples/....py` a command runs: itself,
    or torchrun's script, or the `bash -c` script torchrun --no-python runs."""
    words = words[1:] if words[:1] == ["exec"] else words
    if words[:1] == ["python"] and len(words) > 1:
        return [(words[1], words[2:])]
    if words[:1] != ["torchrun"]:
        return []
    args = torchrun_args(words, {})
    if not args.no_python:
        return [(args.training_script, args.training_script_args)]
    if args.training_script in ("bash", "sh") and args.training_script_args[:1] == ["-c"]:
        return [found for inner in shell_commands(args.training_script_args[1]) for found in examples_run(inner)]
    return []


def inner_words(words):
    """The words of the `bash -c` script a torchrun --no-python command runs (else none)."""
    args = torchrun_args(words, {})
    if args.no_python and args.training_script_args[:1] == ["-c"]:
        return sum(shell_commands(args.training_script_args[1]), [])
    return []


def raw_option(words, *names):
    """The unexpanded value of a command's option (--name=value or --name value), else ""."""
    for i, word in enumerate(words):
        key, _, value = word.partition("=")
        if key in names:
            return value if "=" in word else (words[i + 1] if i + 1 < len(words) else "")
    return ""


def torchrun_args(words, env):
    """A torchrun command line as torchrun's own parser reads it (an unknown flag fails); the
    variables of its --flag=value words expanded, not those of the script it runs."""
    from torch.distributed.run import get_args_parser

    return get_args_parser().parse_args([expand(w, env) if w.startswith("--") else w for w in words[1:]])


def flag_value(args, flag, default):
    """The value of --flag (or --flag=value) in an example's arguments, else default."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return default


def check_resources(name, container, errors):
    """Quantities in Kubernetes' syntax; extended resources (google.com/tpu) whole numbers,
    requests equal to limits, as the API server requires."""
    res = container.get("resources") or {}
    for kind in ("requests", "limits"):
        for resource, value in (res.get(kind) or {}).items():
            if isinstance(value, bool) or not QUANTITY.match(str(value)):
                errors.append(f"{name}: {kind}[{resource}] = {value!r} is not a Kubernetes quantity")
            elif "/" in resource and not resource.startswith("kubernetes.io/"):
                if not str(value).isdigit():
                    errors.append(f"{name}: {kind}[{resource}] = {value!r}: an extended resource is a whole number")
    for resource in set(res.get("requests") or {}) | set(res.get("limits") or {}):
        if "/" in resource and (res.get("requests") or {}).get(resource) != (res.get("limits") or {}).get(resource):
            errors.append(f"{name}: {resource}: requests and limits must be equal for an extended resource")


def check_tpu(name, replicas, spec, pod, container, errors):
    """The node selectors and the chips of a TPU slice: each pod is a host of the slice, all of
    them at once, and hosts x chips per host is the topology's chip count."""
    selectors = pod.get("nodeSelector") or {}
    accelerator, topology = selectors.get(ACCELERATOR), selectors.get(TOPOLOGY)
    if accelerator not in CHIPS_PER_HOST or not re.fullmatch(r"\d+(x\d+)+", str(topology)):
        errors.append(f"{name}: node selectors {ACCELERATOR} (one of {sorted(CHIPS_PER_HOST)}) and {TOPOLOGY}")
        return
    chips = math.prod(int(d) for d in topology.split("x"))
    hosts = spec.get("parallelism", 1)
    per_host = (container.get("resources") or {}).get("limits", {}).get(TPU)
    if spec.get("completions", 1) != hosts:
        errors.append(
            f"{name}: completions {spec.get('completions', 1)} != parallelism {hosts}: a slice's hosts run at once"
        )
    if (
        not isinstance(per_host, int)
        or per_host not in CHIPS_PER_HOST[accelerator]["single" if hosts == 1 else "multi"]
    ):
        errors.append(f"{name}: {TPU} = {per_host!r} is not the chip count of a {accelerator} host")
    elif per_host * hosts != chips:
        errors.append(f"{name}: {hosts} hosts x {per_host} chips != {chips} chips of topology {topology}")
    if hosts > 1 and spec.get("completionMode") != "Indexed":
        errors.append(f"{name}: the hosts of a multi-host slice need completionMode: Indexed (their ranks)")


def check_torchrun(name, replicas, spec, rj, doc, words, env, errors, chips_per_pod):
    """torchrun's nodes are the pods of the Job or JobSet, each pod's rank its completion index,
    the rendezvous on pod 0 by its DNS name; on a TPU one process per chip, each told which
    (TPU_VISIBLE_CHIPS). Returns the number of processes."""
    args = torchrun_args(words, env)
    nnodes = int(str(args.nnodes).split(":")[-1])
    pods = replicas * spec.get("parallelism", 1)
    if nnodes != pods:
        errors.append(f"{name}: torchrun --nnodes {args.nnodes} != {pods} pods (replicas x parallelism)")
    if not args.nproc_per_node.isdigit():
        errors.append(f"{name}: --nproc-per-node {args.nproc_per_node}: give the number of processes")
        return nnodes
    if chips_per_pod is not None and args.nproc_per_node != str(chips_per_pod):
        errors.append(f"{name}: --nproc-per-node {args.nproc_per_node} != {chips_per_pod} chips per pod")
    if (
        chips_per_pod is not None
        and int(args.nproc_per_node) > 1
        and "TPU_VISIBLE_CHIPS=$LOCAL_RANK" not in inner_words(words)
    ):
        errors.append(f"{name}: each process on a TPU host needs TPU_VISIBLE_CHIPS=$LOCAL_RANK")
    if nnodes > 1:
        rank = raw_option(words, "--node-rank", "--node_rank")
        var = env.get(rank.strip("${}"), {})
        if var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != COMPLETION_INDEX or replicas != 1:
            errors.append(f"{name}: --node-rank must be the pod's completion index (one replica): {rank!r}")
        network = doc["spec"].get("network", {}) if rj is not None else {}
        subdomain = network.get("subdomain", doc["metadata"]["name"])
        pod0 = f"{doc['metadata']['name']}-{rj['name'] if rj else ''}-0-0.{subdomain}"
        if rj is None or not network.get("enableDNSHostnames") or args.master_addr != pod0:
            errors.append(f"{name}: --master-addr {args.master_addr} is not pod 0's DNS name {pod0}")
        if args.standalone:
            errors.append(f"{name}: --standalone over several nodes")
    return nnodes * int(args.nproc_per_node)


def check_example(name, example, args, world, errors):
    """The example exists under examples/, knows each option it is given, and its batch (given
    or default) splits over the processes that run it."""
    path = ROOT / example
    if not example.startswith("examples/") or not path.is_file():
        errors.append(f"{name}: runs {example}, which is not a file of examples/")
        return
    options = example_options(path)
    for arg in args:
        if arg.startswith("-") and arg.split("=", 1)[0] not in options:
            errors.append(f"{name}: {example} has no option {arg}")
    batch = flag_value(args, "--batch-size", options.get("--batch-size"))
    if batch is not None and int(batch) % world:
        errors.append(f"{name}: {example} --batch-size {batch} does not split over {world} processes")


def problems(file, docs):
    """What is wrong in a manifest beyond its schema: a list of sentences, empty when right."""
    errors, platform, ran = [], MANIFESTS.get(file), []
    if platform is None:
        return [f"{file}: not listed in MANIFESTS of {pathlib.Path(__file__).name}"]
    for doc in docs:
        for name, replicas, spec, rj in workloads(doc):
            pod = spec["template"]["spec"]
            if spec.get("backoffLimit") != 0:
                errors.append(f"{name}: backoffLimit must be 0 (a failed run is read, not retried)")
            for container in pod["containers"]:
                env = {e["name"]: e for e in container.get("env") or []}
                check_resources(name, container, errors)
                tpu = (container.get("resources") or {}).get("limits", {}).get(TPU)
                uses_tpu = tpu is not None or any(
                    k.startswith("cloud.google.com/gke-tpu") for k in pod.get("nodeSelector") or {}
                )
                if uses_tpu != (platform == "tpu"):
                    errors.append(f"{name}: TPU node selectors and {TPU} belong on the TPU manifests only")
                if uses_tpu:
                    check_tpu(name, replicas, spec, pod, container, errors)
                if env.get("TORCHTPU_PLATFORM", {}).get("value") != platform:
                    errors.append(f"{name}: TORCHTPU_PLATFORM must be {platform}")
                for words in container_commands(container):
                    world = 1
                    if words[:1] == ["torchrun"]:
                        world = check_torchrun(name, replicas, spec, rj, doc, words, env, errors, tpu)
                    for example, args in examples_run(words):
                        ran.append(example)
                        check_example(name, example, args, world, errors)
    if not ran:
        errors.append(f"{file}: runs no example")
    return errors


def check(file, docs):
    """Raises jsonschema.ValidationError or ManifestError for what is wrong in a manifest."""
    for doc in docs:
        validate(doc)
    errors = problems(file, docs)
    if errors:
        raise ManifestError("; ".join(errors))


def test_every_manifest_is_listed_and_parses():
    files = sorted(p.name for p in GKE.iterdir() if p.suffix in (".yaml", ".yml"))
    assert files == sorted(MANIFESTS)
    for file in files:
        docs = documents(GKE / file)
        assert docs and all(isinstance(d, dict) and d.get("apiVersion") and d.get("kind") for d in docs)


def test_the_jobset_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(JOBSET_SCHEMA)


@pytest.mark.parametrize("file", sorted(MANIFESTS))
def test_manifest_validates_against_its_schemas(file):
    for doc in documents(GKE / file):
        validate(doc)


@pytest.mark.parametrize("file", sorted(MANIFESTS))
def test_manifest_is_consistent(file):
    assert problems(file, documents(GKE / file)) == []


def test_the_manifests_cover_what_docs_gke_describes():
    kinds = {(f, d["kind"]) for f in MANIFESTS for d in documents(GKE / f)}
    assert ("single-host-v5e.yaml", "Job") in kinds and ("multi-host-jobset.yaml", "JobSet") in kinds
    single = documents(GKE / "single-host-v5e.yaml")[0]["spec"]["template"]["spec"]
    assert single["nodeSelector"] == {ACCELERATOR: "tpu-v5-lite-podslice", TOPOLOGY: "2x4"}
    assert single["containers"][0]["resources"]["limits"][TPU] == 8
    jobset = documents(GKE / "multi-host-jobset.yaml")[0]
    job = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["template"]["spec"]["nodeSelector"][TOPOLOGY] == "4x4"
    assert (job["completions"], job["parallelism"], job["completionMode"], job["backoffLimit"]) == (4, 4, "Indexed", 0)
    for doc in documents(GKE / "cpu-only.yaml"):
        assert "nodeSelector" not in doc["spec"]["template"]["spec"]
    text = (ROOT / "docs" / "gke.md").read_text()
    for file in MANIFESTS:
        assert f"deploy/gke/{file}" in text


def _jobset_pod(docs):
    return docs[0]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def _single_pod(docs):
    return docs[0]["spec"]["template"]["spec"]


def _edit_script(pod, old, new):
    args = pod["containers"][0]["args"]
    assert old in args[0]
    args[0] = args[0].replace(old, new)


BROKEN = {
    # schema errors
    "misspelled Job field": ("single-host-v5e.yaml", lambda d: d[0]["spec"].update(backofLimit=0), "backofLimit"),
    "misspelled container field": (
        "cpu-only.yaml",
        lambda d: _single_pod(d)["containers"][0].update(workDir="/opt"),
        "workDir",
    ),
    "misspelled JobSet field": (
        "multi-host-jobset.yaml",
        lambda d: d[0]["spec"]["network"].update(enableDnsHostnames=True),
        "enableDnsHostnames",
    ),
    "misspelled pod field in a JobSet": (
        "multi-host-jobset.yaml",
        lambda d: _jobset_pod(d).update(nodeSelectors={}),
        "nodeSelectors",
    ),
    "JobSet replicas as a string": (
        "multi-host-jobset.yaml",
        lambda d: d[0]["spec"]["replicatedJobs"][0].update(replicas="one"),
        "'one'",
    ),
    "wrong kind of value": (
        "single-host-v5e.yaml",
        lambda d: d[0]["spec"].update(parallelism="all"),
        "'all'",
    ),
    "a kind with no schema": ("cpu-only.yaml", lambda d: d[0].update(kind="Jbo"), "Jbo"),
    # what a schema cannot see
    "google.com/tpu as a word": (
        "single-host-v5e.yaml",
        lambda d: _single_pod(d)["containers"][0]["resources"].update(requests={TPU: "eight"}, limits={TPU: "eight"}),
        "'eight' is not a Kubernetes quantity",
    ),
    "chips short of the topology": (
        "single-host-v5e.yaml",
        lambda d: _single_pod(d)["containers"][0]["resources"].update(requests={TPU: 4}, limits={TPU: 4}),
        "!= 8 chips of topology 2x4",
    ),
    "requests unlike limits": (
        "multi-host-jobset.yaml",
        lambda d: _jobset_pod(d)["containers"][0]["resources"]["requests"].update({TPU: 8}),
        "requests and limits must be equal",
    ),
    "hosts short of the topology": (
        "multi-host-jobset.yaml",
        lambda d: d[0]["spec"]["replicatedJobs"][0]["template"]["spec"].update(completions=2, parallelism=2),
        "2 hosts x 4 chips != 16",
    ),
    "no topology selector": (
        "multi-host-jobset.yaml",
        lambda d: _jobset_pod(d)["nodeSelector"].pop(TOPOLOGY),
        "node selectors",
    ),
    "TPU selectors on the CPU manifest": (
        "cpu-only.yaml",
        lambda d: _single_pod(d).update(nodeSelector={ACCELERATOR: "tpu-v5-lite-podslice"}),
        "belong on the TPU manifests only",
    ),
    "--nnodes unlike the pods": (
        "multi-host-jobset.yaml",
        lambda d: _edit_script(_jobset_pod(d), "--nnodes=4", "--nnodes=2"),
        "--nnodes 2 != 4 pods",
    ),
    "rendezvous on another pod": (
        "multi-host-jobset.yaml",
        lambda d: _jobset_pod(d)["containers"][0]["env"][2].update(value="torchtpu-ddp-slice-0-1.torchtpu-ddp"),
        "is not pod 0's DNS name",
    ),
    "rank not from the completion index": (
        "multi-host-jobset.yaml",
        lambda d: _jobset_pod(d)["containers"][0]["env"][1]["valueFrom"]["fieldRef"].update(fieldPath="metadata.name"),
        "completion index",
    ),
    "one process for 4 chips": (
        "multi-host-jobset.yaml",
        lambda d: _edit_script(_jobset_pod(d), "--nproc-per-node=4", "--nproc-per-node=1"),
        "--nproc-per-node 1 != 4 chips per pod",
    ),
    "processes not told their chip": (
        "single-host-v5e.yaml",
        lambda d: _edit_script(_single_pod(d), 'export TPU_VISIBLE_CHIPS="$LOCAL_RANK" ', "export "),
        "needs TPU_VISIBLE_CHIPS=$LOCAL_RANK",
    ),
    "an example that does not exist": (
        "cpu-only.yaml",
        lambda d: _edit_script(_single_pod(d), "examples/char_gpt.py", "examples/char_gtp.py"),
        "not a file of examples/",
    ),
    "a flag the example lacks": (
        "cpu-only.yaml",
        lambda d: _edit_script(_single_pod(d), "--steps 20", "--step 20"),
        "has no option --step",
    ),
    "a batch that does not split": (
        "multi-host-jobset.yaml",
        lambda d: _edit_script(_jobset_pod(d), "--batch-size 32", "--batch-size 24"),
        "does not split over 16 processes",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_manifest_fails(case):
    file, breaks, message = BROKEN[case]
    docs = copy.deepcopy(documents(GKE / file))
    check(file, docs)  # the manifest as shipped passes
    breaks(docs)
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.SchemaNotFoundError, ManifestError)) as e:
        check(file, docs)
    assert message in str(e.value) + getattr(e.value, "message", "")
