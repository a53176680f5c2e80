package dns

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// RoleName names the ClusterRole of the resolver and the ClusterRoleBinding
// that grants it.
const RoleName = "k3sm:node-dns"

// Rules are what the resolver reads: Services and EndpointSlices, listed
// and watched (no get: informers never need it). Pods and Namespaces are
// not read.
func Rules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
	}
}

// EnsureRBAC creates or updates the ClusterRole RoleName to Rules and adds
// user to the subjects of the ClusterRoleBinding RoleName, keeping the
// others (every node's identity is granted in turn). Idempotent.
func EnsureRBAC(ctx context.Context, c kubernetes.Interface, user string) error {
	if user == "" {
		return errors.New("dns: EnsureRBAC needs a user")
	}
	labels := map[string]string{"app.kubernetes.io/managed-by": "k3sm"}
	roles := c.RbacV1().ClusterRoles()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		have, err := roles.Get(ctx, RoleName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = roles.Create(ctx, &rbacv1.ClusterRole{
				ObjectMeta: metav1.ObjectMeta{Name: RoleName, Labels: labels},
				Rules:      Rules(),
			}, metav1.CreateOptions{})
			return conflictIfExists(err, "clusterroles")
		} else if err != nil {
			return err
		}
		if reflect.DeepEqual(have.Rules, Rules()) && have.AggregationRule == nil {
			return nil
		}
		have.Rules, have.AggregationRule = Rules(), nil
		_, err = roles.Update(ctx, have, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("dns: ClusterRole %s: %w", RoleName, err)
	}

	subject := rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}
	roleRef := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: RoleName}
	bindings := c.RbacV1().ClusterRoleBindings()
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		have, err := bindings.Get(ctx, RoleName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = bindings.Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: RoleName, Labels: labels},
				RoleRef:    roleRef,
				Subjects:   []rbacv1.Subject{subject},
			}, metav1.CreateOptions{})
			return conflictIfExists(err, "clusterrolebindings")
		} else if err != nil {
			return err
		}
		if have.RoleRef != roleRef {
			// roleRef is immutable: replace the binding, keeping its subjects.
			if err := bindings.Delete(ctx, RoleName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			subjects := have.Subjects
			if !slices.Contains(subjects, subject) {
				subjects = append(subjects, subject)
			}
			_, err = bindings.Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: RoleName, Labels: labels},
				RoleRef:    roleRef,
				Subjects:   subjects,
			}, metav1.CreateOptions{})
			return conflictIfExists(err, "clusterrolebindings")
		}
		if slices.Contains(have.Subjects, subject) {
			return nil
		}
		have.Subjects = append(have.Subjects, subject)
		_, err = bindings.Update(ctx, have, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("dns: ClusterRoleBinding %s: %w", RoleName, err)
	}
	return nil
}

// conflictIfExists turns losing a create race into a conflict, so
// RetryOnConflict reads the winner and tries again.
func conflictIfExists(err error, resource string) error {
	if apierrors.IsAlreadyExists(err) {
		return apierrors.NewConflict(rbacv1.Resource(resource), RoleName, err)
	}
	return err
}
