package netpol

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

// RoleName names the ClusterRole of the controller and the
// ClusterRoleBinding that grants it.
const RoleName = "k3sm:node-netpol"

// Rules are what the controller watches. The Node authorizer lets a node
// read only its own pods; policy peers are pods anywhere.
func Rules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods", "namespaces"}, Verbs: []string{"list", "watch"}},
	}
}

// EnsureRBAC creates or updates the ClusterRole RoleName to Rules and binds
// it to user in the ClusterRoleBinding RoleName, which every node shares:
// user is added to its subjects, no other subject is removed.
func EnsureRBAC(ctx context.Context, c kubernetes.Interface, user string) error {
	if user == "" {
		return fmt.Errorf("netpol: EnsureRBAC needs a user")
	}
	labels := map[string]string{"app.kubernetes.io/managed-by": "k3sm"}
	meta := metav1.ObjectMeta{Name: RoleName, Labels: labels}
	roles := c.RbacV1().ClusterRoles()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		have, err := roles.Get(ctx, RoleName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = roles.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: meta, Rules: Rules()}, metav1.CreateOptions{})
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
	bindings := c.RbacV1().ClusterRoleBindings()
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		have, err := bindings.Get(ctx, RoleName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = bindings.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: meta, RoleRef: roleRef, Subjects: []rbacv1.Subject{subject}}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(rbacv1.Resource("clusterrolebindings"), RoleName, err)
			}
			return err
		} else if err != nil {
			return err
		}
		subjects := have.Subjects
		bound := false
		for _, s := range subjects {
			bound = bound || s == subject
		}
		if !bound {
			subjects = append(subjects[:len(subjects):len(subjects)], subject)
		}
		if have.RoleRef != roleRef {
			// roleRef is immutable: replace the binding, keeping its subjects.
			if err := bindings.Delete(ctx, RoleName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			_, err = bindings.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: meta, RoleRef: roleRef, Subjects: subjects}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(rbacv1.Resource("clusterrolebindings"), RoleName, err)
			}
			return err
		}
		if bound {
			return nil
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
