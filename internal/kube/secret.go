package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReadSecret returns the data of the Secret ref names (nil for a nil ref),
// for the secrets field of a CSI call; field is the PersistentVolume field
// that named it (controllerPublishSecretRef), for the error. Secrets are
// read with a GET when a call needs them and never cached, watched or
// logged: a Secret informer would keep every Secret of the cluster in the
// sidecar's memory and need RBAC to list them all.
func ReadSecret(ctx context.Context, client Client, ref *corev1.SecretReference, field string) (map[string]string, error) {
	if ref == nil {
		return nil, nil
	}
	s, err := client.CoreV1().Secrets(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get the %s Secret %s/%s: %w", field, ref.Namespace, ref.Name, err)
	}
	out := make(map[string]string, len(s.Data))
	for k, v := range s.Data {
		out[k] = string(v)
	}
	return out, nil
}
