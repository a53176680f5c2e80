package join

import (
	"context"
	"slices"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// A joining node is told every apiserver that is ready, this one first,
// from the kubernetes Service's endpoints.
func TestAPIServers(t *testing.T) {
	cs := fake.NewClientset()
	self := "https://192.0.2.1:6443"
	got, err := APIServers(context.Background(), cs, self)
	if err != nil || !slices.Equal(got, []string{self}) {
		t.Fatalf("no endpoints: %v %v, want self alone", got, err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "kubernetes", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To[int32](6443)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"192.0.2.1"}},
			{Addresses: []string{"192.0.2.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
			{Addresses: []string{"192.0.2.3"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}},
		},
	}
	other := slice.DeepCopy()
	other.Name, other.Labels = "other", map[string]string{discoveryv1.LabelServiceName: "other"}
	other.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.9"}}}
	for _, s := range []*discoveryv1.EndpointSlice{slice, other} {
		if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	got, err = APIServers(context.Background(), cs, self)
	if want := []string{self, "https://192.0.2.2:6443"}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("APIServers = %v %v, want %v (ready ones, self once, not other Services')", got, err, want)
	}
}
