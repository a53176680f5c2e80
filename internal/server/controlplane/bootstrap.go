package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// requiredClusterRoles must exist after the apiserver's RBAC bootstrap.
var requiredClusterRoles = []string{
	"cluster-admin", "admin", "edit", "view",
	"system:basic-user", "system:discovery", "system:public-info-viewer",
	"system:node", "system:node-bootstrapper", "system:kube-scheduler",
	"system:kube-controller-manager", "system:kubelet-api-admin",
}

// requiredBindings must exist and name the subject the server relies on.
var requiredBindings = map[string]rbacv1.Subject{
	"cluster-admin":                  {Kind: rbacv1.GroupKind, Name: "system:masters"},
	"system:kube-scheduler":          {Kind: rbacv1.UserKind, Name: SchedulerUser},
	"system:kube-controller-manager": {Kind: rbacv1.UserKind, Name: ControllerManagerUser},
	"system:basic-user":              {Kind: rbacv1.GroupKind, Name: "system:authenticated"},
}

// KubeletAPIBinding lets the apiserver use node APIs (logs, exec, port-forward).
const KubeletAPIBinding = "k3sm:kube-apiserver-kubelet-api-admin"

// accessCheck is one authorization decision the server depends on.
type accessCheck struct {
	desc    string
	user    string
	groups  []string
	attrs   authorizationv1.ResourceAttributes
	allowed bool
}

var accessChecks = []accessCheck{
	{"scheduler may bind pods", SchedulerUser, nil,
		authorizationv1.ResourceAttributes{Verb: "create", Resource: "pods", Subresource: "binding", Namespace: "default"}, true},
	{"controller-manager may read service accounts", ControllerManagerUser, nil,
		authorizationv1.ResourceAttributes{Verb: "get", Resource: "serviceaccounts", Namespace: "kube-system"}, true},
	{"apiserver may use node APIs", KubeletClientUser, nil,
		authorizationv1.ResourceAttributes{Verb: "create", Resource: "nodes", Subresource: "proxy", Name: "any"}, true},
	{"a node may read its own Node (Node authorizer)", "system:node:k3sm-probe", []string{"system:nodes", "system:authenticated"},
		authorizationv1.ResourceAttributes{Verb: "get", Resource: "nodes", Name: "k3sm-probe"}, true},
	{"a node may not read arbitrary Secrets", "system:node:k3sm-probe", []string{"system:nodes", "system:authenticated"},
		authorizationv1.ResourceAttributes{Verb: "get", Resource: "secrets", Namespace: "kube-system", Name: "k3sm-probe"}, false},
	{"an unbound user may not list Secrets", "k3sm:probe-nobody", []string{"system:authenticated"},
		authorizationv1.ResourceAttributes{Verb: "list", Resource: "secrets", Namespace: "kube-system"}, false},
	{"an unbound user may not create Pods", "k3sm:probe-nobody", []string{"system:authenticated"},
		authorizationv1.ResourceAttributes{Verb: "create", Resource: "pods", Namespace: "default"}, false},
}

// BootstrapAuthorization lays down k3sm's own RBAC objects and then verifies
// that the authorization graph the server relies on is in place and
// behaves: required roles and bindings exist, and a set of allow and deny
// decisions come out right. It retries until ctx ends and then fails closed:
// the caller must not go on serving with an unverified authorizer.
// Failed attempts are logged at debug level to log (which may be nil).
func BootstrapAuthorization(ctx context.Context, client kubernetes.Interface, log *slog.Logger) error {
	var last error
	for attempt := 1; ; attempt++ {
		last = bootstrapOnce(ctx, client)
		if last == nil {
			return nil
		}
		if log != nil {
			log.Debug("authorization bootstrap attempt failed", "attempt", attempt, "err", last)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("authorization bootstrap could not be verified, refusing to serve: %w", last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func bootstrapOnce(ctx context.Context, client kubernetes.Interface) error {
	rbac := client.RbacV1()
	roles, err := rbac.ClusterRoles().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list ClusterRoles: %w", err)
	}
	haveRole := map[string]bool{}
	for _, r := range roles.Items {
		haveRole[r.Name] = true
	}
	for _, name := range requiredClusterRoles {
		if !haveRole[name] {
			return fmt.Errorf("ClusterRole %s is missing", name)
		}
	}
	bindings, err := rbac.ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list ClusterRoleBindings: %w", err)
	}
	haveBinding := map[string]rbacv1.ClusterRoleBinding{}
	for _, b := range bindings.Items {
		haveBinding[b.Name] = b
	}
	for name, subject := range requiredBindings {
		b, ok := haveBinding[name]
		if !ok {
			return fmt.Errorf("ClusterRoleBinding %s is missing", name)
		}
		if !hasSubject(b.Subjects, subject) {
			return fmt.Errorf("ClusterRoleBinding %s does not bind %s %s", name, subject.Kind, subject.Name)
		}
	}
	if err := ensureBinding(ctx, client, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: KubeletAPIBinding, Labels: map[string]string{"app.kubernetes.io/managed-by": "k3sm"}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:kubelet-api-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: KubeletClientUser}},
	}); err != nil {
		return err
	}
	var errs []error
	for _, c := range accessChecks {
		attrs := c.attrs
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: c.user, Groups: c.groups, ResourceAttributes: &attrs}}
		res, err := client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("check %q: %w", c.desc, err)
		}
		if res.Status.Allowed != c.allowed {
			errs = append(errs, fmt.Errorf("check %q failed: allowed=%v (reason %q)", c.desc, res.Status.Allowed, res.Status.Reason))
		}
	}
	return errors.Join(errs...)
}

func ensureBinding(ctx context.Context, client kubernetes.Interface, want *rbacv1.ClusterRoleBinding) error {
	crb := client.RbacV1().ClusterRoleBindings()
	have, err := crb.Get(ctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = crb.Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	}
	if err != nil {
		return err
	}
	if have.RoleRef != want.RoleRef {
		// roleRef is immutable: replace the binding.
		if err := crb.Delete(ctx, want.Name, metav1.DeleteOptions{}); err != nil {
			return err
		}
		_, err = crb.Create(ctx, want, metav1.CreateOptions{})
		return err
	}
	if len(have.Subjects) != len(want.Subjects) || !hasSubject(have.Subjects, want.Subjects[0]) {
		have.Subjects = want.Subjects
		_, err = crb.Update(ctx, have, metav1.UpdateOptions{})
	}
	return err
}

func hasSubject(subjects []rbacv1.Subject, want rbacv1.Subject) bool {
	for _, s := range subjects {
		if s.Kind == want.Kind && s.Name == want.Name {
			return true
		}
	}
	return false
}
