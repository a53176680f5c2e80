package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/k3sm-dev/k3sm/internal/agent/proxy"
)

// nameServer answers every connection with its name and closes it.
func nameServer(name string) (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, name)
			c.Close()
		}
	}()
	return ln, nil
}

// follow measures how long traffic takes to follow an EndpointSlice
// change: the Service's one endpoint is moved between two backends n times
// and, after each update, the ClusterIP is dialled until the new backend
// answers. It returns the p50 and p99 of those times.
func follow(n int) (p50, p99 time.Duration, err error) {
	a, err := nameServer("a")
	if err != nil {
		return 0, 0, err
	}
	defer a.Close()
	b, err := nameServer("b")
	if err != nil {
		return 0, 0, err
	}
	defer b.Close()
	const clusterIP = "127.0.0.51"
	ln, err := net.Listen("tcp", clusterIP+":0")
	if err != nil {
		return 0, 0, err
	}
	port := int32(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "flip"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			Ports: []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: port}}},
	}
	slice := func(to net.Listener) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "flip-1", Labels: map[string]string{discoveryv1.LabelServiceName: "flip"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("tcp"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(to.Addr().(*net.TCPAddr).Port))}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"127.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		}
	}
	client := fake.NewClientset(svc, slice(a))
	p, err := proxy.New(proxy.Config{Client: client, NodeName: "bench", NodeIPs: []netip.Addr{netip.MustParseAddr("127.0.0.60")},
		Recorder: &record.FakeRecorder{}, Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return 0, 0, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	addr := net.JoinHostPort(clusterIP, fmt.Sprint(port))
	answer := func() string {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return ""
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Second))
		got, _ := io.ReadAll(c)
		return strings.TrimSpace(string(got))
	}
	waitFor := func(want string) (time.Duration, error) {
		start := time.Now()
		for time.Since(start) < 10*time.Second {
			if answer() == want {
				return time.Since(start), nil
			}
			time.Sleep(200 * time.Microsecond)
		}
		return 0, fmt.Errorf("traffic did not follow to %s within 10 s", want)
	}
	if _, err := waitFor("a"); err != nil {
		return 0, 0, err
	}
	var took []time.Duration
	for i := range n {
		to, name := b, "b"
		if i%2 == 1 {
			to, name = a, "a"
		}
		if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, slice(to), metav1.UpdateOptions{}); err != nil {
			return 0, 0, err
		}
		d, err := waitFor(name)
		if err != nil {
			return 0, 0, err
		}
		took = append(took, d)
	}
	slices.Sort(took)
	return took[len(took)/2], took[min(len(took)-1, len(took)*99/100)], nil
}
