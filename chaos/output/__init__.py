"""Output: what a run shows and leaves behind. Renderers, report files and the HTML report
(``reports``), console and live progress, the Prometheus exporter, the vLLM-bench view, the
catalogue and support matrices."""
