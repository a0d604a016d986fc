package httpapi

import (
	"encoding/json"
	"reflect"
	"testing"
)

// TestListsNotNull: every nil list the value reaches (through fields,
// pointers, maps, interfaces, arrays and slices) is written as [], raw
// JSON and bytes are left as they are, and the value given is never
// changed: what holds a nil list is copied.
func TestListsNotNull(t *testing.T) {
	type inner struct {
		Items []string `json:"items"`
		Keep  []int    `json:"keep"`
	}
	type outer struct {
		Ptr    *inner                 `json:"ptr"`
		ByName map[string]inner       `json:"by_name"`
		Any    any                    `json:"any"`
		Arr    [2]inner               `json:"arr"`
		Rows   []inner                `json:"rows"`
		Raw    json.RawMessage        `json:"raw"`
		Maps   map[string][]string    `json:"maps"`
		hidden []string               // unexported: neither written nor walked
		Nested map[string]interface{} `json:"nested"`
	}
	v := outer{Ptr: &inner{Keep: []int{1}}, ByName: map[string]inner{"a": {}}, Any: inner{}, Rows: []inner{{Keep: []int{2}}, {}},
		Maps: map[string][]string{"x": nil}, Nested: map[string]interface{}{"n": []string(nil)}}
	before, _ := json.Marshal(v)
	got, err := json.Marshal(listsNotNull(v))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"ptr":{"items":[],"keep":[1]},"by_name":{"a":{"items":[],"keep":[]}},"any":{"items":[],"keep":[]},` +
		`"arr":[{"items":[],"keep":[]},{"items":[],"keep":[]}],"rows":[{"items":[],"keep":[2]},{"items":[],"keep":[]}],` +
		`"raw":null,"maps":{"x":[]},"nested":{"n":[]}}`
	if string(got) != want {
		t.Fatalf("written as\n%s\nwant\n%s", got, want)
	}
	if after, _ := json.Marshal(v); string(after) != string(before) {
		t.Fatalf("the value given changed:\n%s\nwas\n%s", after, before)
	}
	full := inner{Items: []string{"a"}, Keep: []int{1}}
	if out := listsNotNull(full); !reflect.DeepEqual(out, full) {
		t.Fatalf("a value without a nil list came back as %v", out)
	}
	if listsNotNull(nil) != nil {
		t.Fatal("nil is not nil")
	}
}
