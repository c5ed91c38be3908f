"""Renders kustomizations and validates every object they produce, offline.

    python k8s_validate.py --kubectl kubectl --versions 1.30.0,1.37.0 DIR [DIR ...]

For each DIR: `kubectl kustomize DIR`, then each object:
- a Kubernetes kind: kubernetes-validate's strict schema (unknown fields are errors) for every
  version in --versions (the oldest the manifests support and the newest bundled);
- a custom resource (cert-manager Certificate, Prometheus Operator ServiceMonitor): the
  cloudcoil pydantic model generated from its CRD (types, enums, required fields), and every
  field of the object must be one the model knows (pydantic alone would drop unknown ones);
- any other kind: an error (nothing may go unchecked).
Prints {"DIR": [object, ...], ...} as JSON on stdout for tests/external/deploy.rs to assert properties
on; one line per object and check on stderr. Exits 1 when anything fails.
"""

import argparse
import json
import subprocess
import sys

import kubernetes_validate
import yaml
from kubernetes_validate.utils import SchemaNotFoundError, ValidationError

from cloudcoil.models.cert_manager import v1 as cert_manager_v1
from cloudcoil.models.prometheus_operator import v1 as prometheus_operator_v1

CUSTOM = {
    ("cert-manager.io/v1", "Certificate"): (cert_manager_v1.Certificate, "cloudcoil-models-cert-manager"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): (
        prometheus_operator_v1.ServiceMonitor,
        "cloudcoil-models-prometheus-operator",
    ),
}


def unknown_fields(given, known, path=""):
    """Paths present in `given` (the manifest) that the model's dump `known` lacks."""
    out = []
    if isinstance(given, dict) and isinstance(known, dict):
        for k, v in given.items():
            p = f"{path}.{k}" if path else k
            if k not in known:
                out.append(p)
            else:
                out.extend(unknown_fields(v, known[k], p))
    elif isinstance(given, list) and isinstance(known, list):
        for i, (g, k) in enumerate(zip(given, known)):
            out.extend(unknown_fields(g, k, f"{path}[{i}]"))
    return out


def validate_custom(obj, model):
    parsed = model.model_validate(obj)
    dumped = parsed.model_dump(by_alias=True, exclude_unset=True, mode="json")
    extra = unknown_fields(obj, dumped)
    if extra:
        raise ValueError("fields the CRD does not define: " + ", ".join(extra))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubectl", default="kubectl")
    ap.add_argument("--versions", default="1.30.0,1.37.0")
    ap.add_argument("dirs", nargs="+")
    args = ap.parse_args()
    versions = args.versions.split(",")
    failed = 0
    result = {}
    for d in args.dirs:
        rendered = subprocess.run([args.kubectl, "kustomize", d], capture_output=True, text=True)
        if rendered.returncode != 0:
            print(f"FAIL {d}: kubectl kustomize: {rendered.stderr.strip()}", file=sys.stderr)
            failed += 1
            continue
        objects = [o for o in yaml.safe_load_all(rendered.stdout) if o]
        if not objects:
            print(f"FAIL {d}: rendered no objects", file=sys.stderr)
            failed += 1
        result[d] = objects
        for obj in objects:
            api, kind = obj.get("apiVersion"), obj.get("kind")
            name = (obj.get("metadata") or {}).get("name")
            what = f"{d}: {kind}/{name} ({api})"
            if (api, kind) in CUSTOM:
                model, source = CUSTOM[(api, kind)]
                try:
                    validate_custom(obj, model)
                    print(f"ok   {what}: CRD model {source}", file=sys.stderr)
                except Exception as e:  # pydantic.ValidationError or unknown fields
                    print(f"FAIL {what}: CRD model {source}: {e}", file=sys.stderr)
                    failed += 1
                continue
            for v in versions:
                try:
                    got = kubernetes_validate.validate(obj, v, strict=True)
                    print(f"ok   {what}: Kubernetes {got} schema (strict)", file=sys.stderr)
                except ValidationError as e:
                    where = ".".join(str(p) for p in e.path)
                    print(f"FAIL {what}: Kubernetes {e.version} schema: {where}: {e.message}", file=sys.stderr)
                    failed += 1
                except SchemaNotFoundError as e:
                    print(f"FAIL {what}: no schema to check it against ({e.message})", file=sys.stderr)
                    failed += 1
    json.dump(result, sys.stdout)
    print(f"{failed} failed", file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
