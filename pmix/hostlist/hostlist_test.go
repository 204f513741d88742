package hostlist

import (
	"reflect"
	"strings"
	"testing"
)

func TestExpand(t *testing.T) {
	tests := []struct {
		in      string
		want    []string
		wantErr string
	}{
		{"n1", []string{"n1"}, ""},
		{"n[1-3]", []string{"n1", "n2", "n3"}, ""},
		{"n[1-2,5],gpu7", []string{"n1", "n2", "n5", "gpu7"}, ""},
		{"node[08-10]", []string{"node08", "node09", "node10"}, ""},
		{"a[1-2]-ib", []string{"a1-ib", "a2-ib"}, ""},
		{" n1 , n2 ", []string{"n1", "n2"}, ""},
		{"", nil, "empty host list"},
		{"n[3-1]", nil, "bad range"},
		{"n[1-x]", nil, "bad range"},
		{"n[+1-2]", nil, "bad range"},
		{"n[]", nil, "bad range"},
		{"n]1[", nil, "unbalanced"},
		{"n1,,n2", nil, "bad host"},
		{"n[1-2][3]", nil, "more than one bracket group"},
		{"n[0-2000000]", nil, "too large"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := Expand(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Expand(%q) err %v, want %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Expand(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestCompress(t *testing.T) {
	tests := []struct {
		in   []string
		want string
	}{
		{[]string{"n1"}, "n1"},
		{[]string{"n1", "n2", "n3"}, "n[1-3]"},
		{[]string{"n1", "n2", "n3", "n7", "gpu01"}, "n[1-3,7],gpu01"},
		{[]string{"n9", "n10", "n11"}, "n[9-11]"},
		{[]string{"n09", "n10"}, "n[09-10]"},
		{[]string{"n3", "n1", "n2"}, "n[3,1-2]"},
		{[]string{"login", "n1", "n2"}, "login,n[1-2]"},
		{[]string{"n01", "n1"}, "n[01,1]"},
		{nil, ""},
	}
	for _, tt := range tests {
		got := Compress(tt.in)
		if got != tt.want {
			t.Errorf("Compress(%v) = %q, want %q", tt.in, got, tt.want)
		}
		if len(tt.in) > 0 {
			back, err := Expand(got)
			if err != nil || !reflect.DeepEqual(back, tt.in) {
				t.Errorf("Expand(Compress(%v)) = %v, %v", tt.in, back, err)
			}
		}
	}
}
