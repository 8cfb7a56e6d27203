package main

import (
	"strings"
	"testing"
)

func TestDeviceCollectives(t *testing.T) {
	for _, tt := range []struct{ v, want string }{
		{"", "NEXAR_NCCL_HIER=auto: NCCL within a host"},
		{"on", "NEXAR_NCCL_HIER=on: NCCL within a host"},
		{"off", "NEXAR_NCCL_HIER=off: staged"},
		{"maybe", `NEXAR_NCCL_HIER="maybe": want auto, on or off`},
	} {
		if got := deviceCollectives(tt.v); !strings.Contains(got, tt.want) {
			t.Errorf("deviceCollectives(%q) = %q, want it to contain %q", tt.v, got, tt.want)
		}
	}
}
