package kube

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
)

// StartRecorder starts an event broadcaster that writes the Events of
// component through sink, a clientset's CoreV1() (and logs them at V(3)), and returns its
// recorder and what stops it. The controllers that record Events call it
// when they run and no recorder was given (tests give their own).
func StartRecorder(ctx context.Context, sink typedcorev1.EventsGetter, component string) (record.EventRecorder, func()) {
	events := record.NewBroadcaster(record.WithContext(ctx))
	events.StartStructuredLogging(3)
	events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: sink.Events("")})
	return events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component}), events.Shutdown
}
