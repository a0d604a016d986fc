package wire

import (
	"go/ast"
	"go/parser"
	"go/token"
	"testing"
)

// TestCodesListsEveryCode parses wire.go so a code added to the constants
// but not to Codes fails here, not in a client or a fuzz run.
func TestCodesListsEveryCode(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "wire.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[Code]bool{}
	for _, c := range Codes {
		if listed[c] {
			t.Errorf("Codes lists %q twice", c)
		}
		listed[c] = true
	}
	declared := 0
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			v := s.(*ast.ValueSpec)
			if id, ok := v.Type.(*ast.Ident); !ok || id.Name != "Code" {
				continue
			}
			for _, val := range v.Values {
				lit := val.(*ast.BasicLit)
				declared++
				if code := Code(lit.Value[1 : len(lit.Value)-1]); !listed[code] {
					t.Errorf("code %q is declared but not in Codes", code)
				}
			}
		}
	}
	if declared != len(Codes) {
		t.Errorf("%d codes declared, Codes lists %d", declared, len(Codes))
	}
}
