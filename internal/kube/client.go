package kube

import (
	"fmt"

	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	typedstoragev1 "k8s.io/client-go/kubernetes/typed/storage/v1"
	"k8s.io/client-go/rest"
)

// Client is the part of the Kubernetes API the sidecar's controllers use.
// *kubernetes.Clientset and the fake clientset implement it. A client made of
// just these typed clients keeps the binary about a third smaller than one
// that links the whole clientset, and its resident memory with it.
type Client interface {
	CoreV1() typedcorev1.CoreV1Interface
	StorageV1() typedstoragev1.StorageV1Interface
}

// typedClient is a Client of two typed clients.
type typedClient struct {
	core    typedcorev1.CoreV1Interface
	storage typedstoragev1.StorageV1Interface
}

func (k typedClient) CoreV1() typedcorev1.CoreV1Interface          { return k.core }
func (k typedClient) StorageV1() typedstoragev1.StorageV1Interface { return k.storage }

// NewClient makes a Client from rc. Every typed client shares rc's rate
// limiter, so the QPS of rc is the budget of all of them together.
func NewClient(rc *rest.Config) (Client, error) {
	core, err := typedcorev1.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("create the Kubernetes core/v1 client: %w", err)
	}
	st, err := typedstoragev1.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("create the Kubernetes storage/v1 client: %w", err)
	}
	return typedClient{core: core, storage: st}, nil
}
