#!/usr/bin/env python3
"""Writes deploy/kubernetes/prometheusrule.yaml from dashboards/alerts.yaml: the same alert
rules as a Prometheus Operator PrometheusRule. Run it after changing the rules;
tests/tests/deploy.rs fails while the two disagree."""
import pathlib

import yaml

root = pathlib.Path(__file__).resolve().parent.parent
rules = yaml.safe_load((root / "dashboards" / "alerts.yaml").read_text())
doc = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "PrometheusRule",
    "metadata": {"name": "commscope", "labels": {"app.kubernetes.io/name": "commscope"}},
    "spec": rules,
}
header = (
    "# Generated from dashboards/alerts.yaml by scripts/gen-prometheusrule.py: edit the rules there.\n"
    "# (tests/tests/deploy.rs checks that the two agree.)\n"
)
out = root / "deploy" / "kubernetes" / "prometheusrule.yaml"
out.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=100, allow_unicode=True))
print(f"wrote {out.relative_to(root)}")
