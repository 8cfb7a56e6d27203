package core

import (
	"testing"

	"github.com/nexar-go/nexar/transport"
)

// queuedBehind: a peer is taken for queued behind this thread only on this
// thread's CPU and outside this process, when it polls without beating for
// three looks or when it went to sleep there (a woken thread often waits on
// its waker's CPU, unable to say so).
func TestQueuedBehind(t *testing.T) {
	const cpu = 1
	for _, tc := range []struct {
		name  string
		p     transport.Presence
		still int
		want  bool
	}{
		{"polling, stopped beating, here", transport.Presence{Polling: true, CPU: cpu}, 3, true},
		{"polling, beat lately", transport.Presence{Polling: true, CPU: cpu}, 2, false},
		{"polling on another CPU", transport.Presence{Polling: true, CPU: 0}, 5, false},
		{"asleep here", transport.Presence{Asleep: true, CPU: cpu}, 0, true},
		{"asleep on another CPU", transport.Presence{Asleep: true, CPU: 0}, 0, false},
		{"asleep, CPU unknown", transport.Presence{Asleep: true, CPU: -1}, 0, false},
		{"asleep here, in this process", transport.Presence{Asleep: true, CPU: cpu, InProcess: true}, 0, false},
		{"out of a call here", transport.Presence{CPU: cpu}, 9, false},
	} {
		if got := queuedBehind(tc.p, tc.still, cpu); got != tc.want {
			t.Errorf("%s: queuedBehind(%+v, still %d, cpu %d) = %v, want %v", tc.name, tc.p, tc.still, cpu, got, tc.want)
		}
	}
}
