"""Metrics, alerts, dashboards and logs: kube-prometheus-stack values, the GPU alert rules, DCGM fields, Grafana
dashboards and log retention."""
