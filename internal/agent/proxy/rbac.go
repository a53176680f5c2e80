package proxy

import (
	"context"
	"fmt"
	"reflect"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// RoleName names both the ClusterRole of the proxy and the
// ClusterRoleBinding that grants it.
const RoleName = "k3sm:node-proxy"

// Rules are what a Proxy needs: to watch Services and EndpointSlices, to
// write the LoadBalancer ingress into Service status, and to record Events.
func Rules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"services/status"}, Verbs: []string{"patch", "update"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
}

// EnsureRBAC creates or updates the ClusterRole RoleName to Rules and makes
// the ClusterRoleBinding RoleName bind it to user. The binding is shared by
// every node: user is added to its subjects and no other subject is removed.
func EnsureRBAC(ctx context.Context, client kubernetes.Interface, user string) error {
	if user == "" {
		return fmt.Errorf("proxy: EnsureRBAC needs a user")
	}
	labels := map[string]string{"app.kubernetes.io/managed-by": "k3sm"}
	roles := client.RbacV1().ClusterRoles()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		have, err := roles.Get(ctx, RoleName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = roles.Create(ctx, &rbacv1.ClusterRole{
				ObjectMeta: metav1.ObjectMeta{Name: RoleName, Labels: labels},
				Rules:      Rules(),
			}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(rbacv1.Resource("clusterroles"), RoleName, err)
			}
			return err
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
		return fmt.Errorf("ClusterRole %s: %w", RoleName, err)
	}

	subject := rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}
	roleRef := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: RoleName}
	bindings := client.RbacV1().ClusterRoleBindings()
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		have, err := bindings.Get(ctx, RoleName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = bindings.Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: RoleName, Labels: labels},
				RoleRef:    roleRef,
				Subjects:   []rbacv1.Subject{subject},
			}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(rbacv1.Resource("clusterrolebindings"), RoleName, err)
			}
			return err
		} else if err != nil {
			return err
		}
		subjects := withSubject(have.Subjects, subject)
		if have.RoleRef != roleRef {
			// roleRef is immutable: replace the binding, keeping its subjects.
			if err := bindings.Delete(ctx, RoleName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			_, err = bindings.Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: RoleName, Labels: labels},
				RoleRef:    roleRef,
				Subjects:   subjects,
			}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(rbacv1.Resource("clusterrolebindings"), RoleName, err)
			}
			return err
		}
		if len(subjects) == len(have.Subjects) {
			return nil // user was bound already
		}
		have.Subjects = subjects
		_, err = bindings.Update(ctx, have, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("ClusterRoleBinding %s: %w", RoleName, err)
	}
	return nil
}

// withSubject returns subjects with s added unless it is there already.
func withSubject(subjects []rbacv1.Subject, s rbacv1.Subject) []rbacv1.Subject {
	for _, have := range subjects {
		if have == s {
			return subjects
		}
	}
	return append(subjects[:len(subjects):len(subjects)], s)
}
