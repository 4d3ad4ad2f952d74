package main

import (
	"fmt"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"

	"github.com/loopvol/loopvol/internal/kube/leasewatch"
)

// newLeaderConfig makes the election config of the Lease name from the
// flags: the Lease in --leader-election-namespace, else $POD_NAMESPACE,
// else "default"; an identity that is the host name plus a random suffix,
// so two replicas on one host (as in tests) are told apart; and its own
// client, so a busy controller's rate limit never delays a renewal.
func newLeaderConfig(cfg *config, rc *rest.Config, name string, health *leaderelection.HealthzAdaptor) (leasewatch.Config, error) {
	lec := rest.CopyConfig(rc)
	lec.RateLimiter = nil // its own limiter, from QPS and Burst
	leases, err := coordinationv1.NewForConfig(lec)
	if err != nil {
		return leasewatch.Config{}, fmt.Errorf("create the leader-election client: %w", err)
	}
	host, err := os.Hostname()
	if err != nil {
		return leasewatch.Config{}, fmt.Errorf("leader-election identity: %w", err)
	}
	ns := cfg.leaderElectionNamespace
	if ns == "" {
		ns = os.Getenv("POD_NAMESPACE")
	}
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	return leasewatch.Config{
		Leases:        leases,
		Namespace:     ns,
		Name:          name,
		Identity:      host + "_" + string(uuid.NewUUID()),
		LeaseDuration: cfg.leaderElectionLeaseDuration,
		RenewDeadline: cfg.leaderElectionRenewDeadline,
		RetryPeriod:   cfg.leaderElectionRetryPeriod,
		Labels:        cfg.compat.leaderElectionLabels,
		Health:        health,
	}, nil
}
