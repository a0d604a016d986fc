package httpapi

import (
	"reflect"

	"github.com/labstack/echo/v4"
)

// listSerializer is echo's JSON serializer with every list in an answer
// written as a JSON array, never null: a nil slice anywhere in the value
// (a page that matched nothing) is written as []. The contract promises a
// list where a client iterates (`jq '.jobs[]'`, the console's rows), and a
// null there is a client's crash.
type listSerializer struct{ echo.DefaultJSONSerializer }

func (s listSerializer) Serialize(c echo.Context, v any, indent string) error {
	return s.DefaultJSONSerializer.Serialize(c, listsNotNull(v), indent)
}

var byteSlice = reflect.TypeFor[[]byte]()

// listsNotNull is v with each nil slice reachable through its exported
// fields, elements, map values and pointers made empty. v itself is never
// changed: what holds a nil slice is copied (the host may keep and share
// what it answered with).
func listsNotNull(v any) any {
	if v == nil {
		return nil
	}
	rv := reflect.ValueOf(v)
	if fixed, changed := fillLists(rv); changed {
		return fixed.Interface()
	}
	return v
}

// fillLists answers v with its nil slices made empty, and whether that
// changed anything (when not, v is answered as it is, uncopied).
func fillLists(v reflect.Value) (reflect.Value, bool) {
	switch v.Kind() {
	case reflect.Slice, reflect.Array:
		return fillSequence(v)
	case reflect.Pointer:
		if v.IsNil() {
			return v, false
		}
		elem, changed := fillLists(v.Elem())
		if !changed {
			return v, false
		}
		p := reflect.New(v.Type().Elem())
		p.Elem().Set(elem)
		return p, true
	case reflect.Interface:
		if v.IsNil() {
			return v, false
		}
		elem, changed := fillLists(v.Elem())
		if !changed {
			return v, false
		}
		out := reflect.New(v.Type()).Elem()
		out.Set(elem)
		return out, true
	case reflect.Map:
		return fillMap(v)
	case reflect.Struct:
		return fillStruct(v)
	}
	return v, false
}

// fillSequence is fillLists of a slice or an array.
func fillSequence(v reflect.Value) (reflect.Value, bool) {
	if v.Kind() == reflect.Slice {
		if v.Type().Elem().Kind() == reflect.Uint8 || v.Type().ConvertibleTo(byteSlice) {
			return v, false // bytes: base64, or raw JSON (json.RawMessage) written as it is
		}
		if v.IsNil() {
			return reflect.MakeSlice(v.Type(), 0, 0), true
		}
	}
	var out reflect.Value
	for i := range v.Len() {
		elem, changed := fillLists(v.Index(i))
		if !changed {
			continue
		}
		if !out.IsValid() {
			out = copyOf(v)
		}
		out.Index(i).Set(elem)
	}
	return orSame(out, v)
}

// fillMap is fillLists of a map: a copy when any value changes.
func fillMap(v reflect.Value) (reflect.Value, bool) {
	if v.IsNil() {
		return v, false
	}
	var out reflect.Value
	iter := v.MapRange()
	for iter.Next() {
		elem, changed := fillLists(iter.Value())
		if !changed {
			continue
		}
		if !out.IsValid() {
			out = reflect.MakeMapWithSize(v.Type(), v.Len())
			for k := range v.Seq2() {
				out.SetMapIndex(k, v.MapIndex(k))
			}
		}
		out.SetMapIndex(iter.Key(), elem)
	}
	return orSame(out, v)
}

// fillStruct is fillLists of a struct's exported fields.
func fillStruct(v reflect.Value) (reflect.Value, bool) {
	var out reflect.Value
	t := v.Type()
	for i := range v.NumField() {
		if !t.Field(i).IsExported() {
			continue
		}
		field, changed := fillLists(v.Field(i))
		if !changed {
			continue
		}
		if !out.IsValid() {
			out = reflect.New(t).Elem()
			out.Set(v)
		}
		out.Field(i).Set(field)
	}
	return orSame(out, v)
}

// copyOf is a slice's or an array's elements in storage of their own,
// which can be set without touching v's.
func copyOf(v reflect.Value) reflect.Value {
	if v.Kind() == reflect.Slice {
		out := reflect.MakeSlice(v.Type(), v.Len(), v.Len())
		reflect.Copy(out, v)
		return out
	}
	out := reflect.New(v.Type()).Elem()
	out.Set(v)
	return out
}

// orSame answers out when a copy was made, else v unchanged.
func orSame(out, v reflect.Value) (reflect.Value, bool) {
	if out.IsValid() {
		return out, true
	}
	return v, false
}
