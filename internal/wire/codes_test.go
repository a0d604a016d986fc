package wire

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"testing"
)

// declaredConstants parses the package's files for the values of the
// constants of a type, so a value added to the constants but not to its
// list fails here, not in a client or a fuzz run.
func declaredConstants(t *testing.T, typeName string) []string {
	t.Helper()
	var decls []ast.Decl
	for _, name := range []string{"wire.go", "events.go"} {
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		decls = append(decls, f.Decls...)
	}
	var out []string
	for _, d := range decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			v := s.(*ast.ValueSpec)
			if id, ok := v.Type.(*ast.Ident); !ok || id.Name != typeName {
				continue
			}
			for _, val := range v.Values {
				lit := val.(*ast.BasicLit)
				out = append(out, lit.Value[1:len(lit.Value)-1])
			}
		}
	}
	return out
}

// listsEvery fails t unless list holds each declared value once.
func listsEvery[T ~string](t *testing.T, typeName, listName string, list []T) {
	t.Helper()
	declared := declaredConstants(t, typeName)
	for i, v := range list {
		if slices.Contains(list[:i], v) {
			t.Errorf("%s lists %q twice", listName, v)
		}
	}
	for _, v := range declared {
		if !slices.Contains(list, T(v)) {
			t.Errorf("%s %q is declared but not in %s", typeName, v, listName)
		}
	}
	if len(declared) != len(list) {
		t.Errorf("%d of %s declared, %s lists %d", len(declared), typeName, listName, len(list))
	}
}

func TestCodesListsEveryCode(t *testing.T) { listsEvery(t, "Code", "Codes", Codes) }

func TestEventKindsListsEveryKind(t *testing.T) { listsEvery(t, "EventKind", "EventKinds", EventKinds) }
