// Command incluster is the in-cluster client the e2e tests run as a pod: an
// unmodified client-go program using rest.InClusterConfig(). It lists the
// pods of its own namespace and exits 0, 3 when the API server denies it,
// or 1 on any other error.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func main() {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		fmt.Println("in-cluster config:", err)
		os.Exit(1)
	}
	ns, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		fmt.Println("namespace:", err)
		os.Exit(1)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Println("client:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods, err := cs.CoreV1().Pods(strings.TrimSpace(string(ns))).List(ctx, metav1.ListOptions{})
	if err != nil {
		fmt.Println("list pods:", err)
		if apierrors.IsForbidden(err) {
			os.Exit(3)
		}
		os.Exit(1)
	}
	fmt.Printf("listed %d pods in %s as %s\n", len(pods.Items), ns, cfg.Host)
}
