// Package agentrbac owns how the agent's parts get the API access the Node
// authorizer does not give a node: one ClusterRole per part, and a
// ClusterRoleBinding of the same name shared by every node's user. The
// server side applies them (it holds the admin credential); each agent
// package names its role and rules.
package agentrbac

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

// Ensure creates or updates the ClusterRole name to rules and makes the
// ClusterRoleBinding name bind it to user. The binding is shared by every
// node: user is added to its subjects and no other subject is removed.
func Ensure(ctx context.Context, client kubernetes.Interface, name string, rules []rbacv1.PolicyRule, user string) error {
	if user == "" {
		return fmt.Errorf("ClusterRole %s: no user to bind it to", name)
	}
	labels := map[string]string{"app.kubernetes.io/managed-by": "k3sm"}
	roles := client.RbacV1().ClusterRoles()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		have, err := roles.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = roles.Create(ctx, &rbacv1.ClusterRole{
				ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
				Rules:      rules,
			}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(rbacv1.Resource("clusterroles"), name, err)
			}
			return err
		} else if err != nil {
			return err
		}
		if reflect.DeepEqual(have.Rules, rules) && have.AggregationRule == nil {
			return nil
		}
		have.Rules, have.AggregationRule = rules, nil
		_, err = roles.Update(ctx, have, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("ClusterRole %s: %w", name, err)
	}

	subject := rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}
	roleRef := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}
	bindings := client.RbacV1().ClusterRoleBindings()
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		have, err := bindings.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = bindings.Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
				RoleRef:    roleRef,
				Subjects:   []rbacv1.Subject{subject},
			}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(rbacv1.Resource("clusterrolebindings"), name, err)
			}
			return err
		} else if err != nil {
			return err
		}
		subjects := withSubject(have.Subjects, subject)
		if have.RoleRef != roleRef {
			// roleRef is immutable: replace the binding, keeping its subjects.
			if err := bindings.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			_, err = bindings.Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
				RoleRef:    roleRef,
				Subjects:   subjects,
			}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(rbacv1.Resource("clusterrolebindings"), name, err)
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
		return fmt.Errorf("ClusterRoleBinding %s: %w", name, err)
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
