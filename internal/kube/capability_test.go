package kube

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestVolumeCapability(t *testing.T) {
	block := corev1.PersistentVolumeBlock
	spec := func(modes []corev1.PersistentVolumeAccessMode, fsType string, opts ...func(*corev1.PersistentVolumeSpec)) *corev1.PersistentVolumeSpec {
		s := &corev1.PersistentVolumeSpec{
			AccessModes:            modes,
			MountOptions:           []string{"noatime"},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "d", VolumeHandle: "h", FSType: fsType}},
		}
		for _, o := range opts {
			o(s)
		}
		return s
	}
	rwo := []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	for _, tc := range []struct {
		name    string
		spec    *corev1.PersistentVolumeSpec
		snmw    bool
		want    string
		wantErr string
	}{
		{name: "mount with the source's fsType", spec: spec(rwo, "xfs"), want: "mount/xfs/[noatime]/SINGLE_NODE_WRITER"},
		{name: "mount without fsType → the default", spec: spec(rwo, ""), want: "mount/ext4/[noatime]/SINGLE_NODE_WRITER"},
		{name: "block", spec: spec(rwo, "xfs", func(s *corev1.PersistentVolumeSpec) { s.VolumeMode = &block }), want: "block/SINGLE_NODE_WRITER"},
		{name: "RWO with SINGLE_NODE_MULTI_WRITER", spec: spec(rwo, "xfs"), snmw: true, want: "mount/xfs/[noatime]/SINGLE_NODE_MULTI_WRITER"},
		{name: "RWX", spec: spec([]corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}, "xfs"), want: "mount/xfs/[noatime]/MULTI_NODE_MULTI_WRITER"},
		{name: "no access mode → an error", spec: spec(nil, "xfs"), wantErr: "AccessMode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vc, err := VolumeCapability(tc.spec, tc.snmw, "ext4")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("VolumeCapability = %v, want an error about %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := capabilityString(vc); got != tc.want {
				t.Errorf("capability %s, want %s", got, tc.want)
			}
		})
	}
}

func capabilityString(vc *csi.VolumeCapability) string {
	mode := vc.GetAccessMode().GetMode().String()
	if vc.GetBlock() != nil {
		return "block/" + mode
	}
	m := vc.GetMount()
	return "mount/" + m.GetFsType() + "/[" + strings.Join(m.GetMountFlags(), ",") + "]/" + mode
}

func TestReadSecret(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "creds"}, Data: map[string][]byte{"user": []byte("u")}})
	if got, err := ReadSecret(ctx, client, nil, "controllerPublishSecretRef"); got != nil || err != nil {
		t.Errorf("no reference: %v, %v; want nothing", got, err)
	}
	got, err := ReadSecret(ctx, client, &corev1.SecretReference{Namespace: "ns", Name: "creds"}, "controllerPublishSecretRef")
	if err != nil || len(got) != 1 || got["user"] != "u" {
		t.Errorf("ReadSecret = %v, %v; want user=u", got, err)
	}
	_, err = ReadSecret(ctx, client, &corev1.SecretReference{Namespace: "ns", Name: "missing"}, "controllerExpandSecretRef")
	if err == nil || !strings.Contains(err.Error(), "controllerExpandSecretRef Secret ns/missing") {
		t.Errorf("missing Secret: %v, want an error naming the field and the Secret", err)
	}
}
