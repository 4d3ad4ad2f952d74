package main

import (
	"fmt"
	"io"
	"log/slog"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/loader"
	"helm.sh/helm/v4/pkg/release"
)

// kubeVersion is what the chart is rendered for: the API server the e2e
// suites run (docs/deploy.md).
const kubeVersion = "v1.37.0"

// releaseName is the release the tests render; the chart's object names
// do not depend on it (a CSI driver is installed once per cluster).
const releaseName = "loopvol"

// renderChart is `helm install --dry-run=client` of the chart with vals
// into namespace: the manifest, as Helm would apply it, after the schema
// and the templates' own checks.
func renderChart(chartPath string, vals map[string]any, namespace string) (string, error) {
	ch, err := loader.Load(chartPath)
	if err != nil {
		return "", fmt.Errorf("load %s: %w", chartPath, err)
	}
	kv, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		return "", err
	}
	cfg := action.NewConfiguration(action.ConfigurationSetLogger(slog.NewTextHandler(io.Discard, nil)))
	install := action.NewInstall(cfg)
	install.DryRunStrategy = action.DryRunClient
	install.ReleaseName = releaseName
	install.Namespace = namespace
	install.KubeVersion = kv
	install.Replace = true // no release storage to check names against
	rel, err := install.Run(ch, vals)
	if err != nil {
		return "", err
	}
	acc, err := release.NewAccessor(rel)
	if err != nil {
		return "", err
	}
	if len(acc.Hooks()) > 0 {
		// Hooks are not part of the manifest the comparison sees.
		return "", fmt.Errorf("the chart has %d hooks; the equality test does not compare them", len(acc.Hooks()))
	}
	return acc.Manifest(), nil
}
