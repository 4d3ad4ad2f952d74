// Package monitoring tests deploy/monitoring: the rules' unit tests
// (promtool test rules' format, run with the Prometheus packages), the
// PrometheusRule made from rules.yaml, and the metric names the rules and
// the dashboard use. It is a module of its own so that the main go.mod does
// not take in Prometheus' dependencies.
package monitoring
