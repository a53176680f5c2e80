// Package localpath owns k3sm's built-in local-path storage: the default
// StorageClass "local-path" (EnsureStorageClass), the RBAC its provisioner
// runs under (EnsureRBAC), and the per-node Provisioner that, for claims
// whose pod the scheduler placed on this node, makes a directory under the
// node's BaseDir and creates a hostPath PersistentVolume pinned to the node,
// and that removes the directory and the volume again when a Delete-policy
// volume is released. It plays the part of an external provisioner: the
// PV controller in kube-controller-manager does the binding.
package localpath

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

const (
	// ProvisionerName is the provisioner of the local-path StorageClass and
	// of the volumes this package creates.
	ProvisionerName = "k3sm.io/local-path"
	// StorageClassName is the StorageClass EnsureStorageClass creates.
	StorageClassName = "local-path"

	// AnnNode names, on a volume this package created, the node whose disk
	// holds the directory; only that node's Provisioner reclaims it.
	AnnNode = "k3sm.io/local-path-node"

	annIsDefaultClass     = "storageclass.kubernetes.io/is-default-class"
	annBetaIsDefaultClass = "storageclass.beta.kubernetes.io/is-default-class"
	annProvisionedBy      = "pv.kubernetes.io/provisioned-by"
	annStorageProvisioner = "volume.kubernetes.io/storage-provisioner"
	annBetaProvisioner    = "volume.beta.kubernetes.io/storage-provisioner"
	annSelectedNode       = "volume.kubernetes.io/selected-node"
	annBetaStorageClass   = "volume.beta.kubernetes.io/storage-class"
	managedBy             = "app.kubernetes.io/managed-by"
)

// EnsureStorageClass creates the local-path StorageClass when no class of
// that name exists, marked as the cluster default unless another class
// already is. An existing local-path class is never modified, so a user's
// edits (or deletion of the default mark) win.
func EnsureStorageClass(ctx context.Context, client kubernetes.Interface) error {
	scs := client.StorageV1().StorageClasses()
	if _, err := scs.Get(ctx, StorageClassName, metav1.GetOptions{}); err == nil {
		return nil
	} else if !apierrors.IsNotFound(err) {
		return fmt.Errorf("get StorageClass %s: %w", StorageClassName, err)
	}
	list, err := scs.List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list StorageClasses: %w", err)
	}
	isDefault := true
	for i := range list.Items {
		if markedDefault(&list.Items[i]) {
			isDefault = false
			break
		}
	}
	sc := &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{
			Name:   StorageClassName,
			Labels: map[string]string{managedBy: "k3sm"},
		},
		Provisioner:          ProvisionerName,
		ReclaimPolicy:        ptr.To(corev1.PersistentVolumeReclaimDelete),
		VolumeBindingMode:    ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
		AllowVolumeExpansion: ptr.To(false),
	}
	if isDefault {
		sc.Annotations = map[string]string{annIsDefaultClass: "true"}
	}
	if _, err := scs.Create(ctx, sc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create StorageClass %s: %w", StorageClassName, err)
	}
	return nil
}

// markedDefault reports whether sc carries the default-class annotation
// (the GA or the beta key), the way the DefaultStorageClass admission
// plugin reads it.
func markedDefault(sc *storagev1.StorageClass) bool {
	return sc.Annotations[annIsDefaultClass] == "true" || sc.Annotations[annBetaIsDefaultClass] == "true"
}
