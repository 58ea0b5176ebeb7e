"""The fleet's own signals a run obeys: Prometheus expressions, Alertmanager alerts, the fleet lever."""
