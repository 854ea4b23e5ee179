// RUN: stageml-opt %s -p flatten-matmul | filecheck %s

// matmul(x[...,K], W[K,N]) with a 2-D W becomes flatten + one 2-D mm + a
// view back; dynamic leading dims are read with aten.size.int, static ones
// fold into the flattened type. A 2-D x is left alone. In the compiler it
// runs after bt-split, on every stage function: here bt-split's @forward,
// whose facts (bt.stage, bt.program, bt.kind, bt.name) stay as they are.

// CHECK-LABEL: func.func @forward
// CHECK-SAME:    (%arg0: !torch.vtensor<[8,4],f32> {bt.kind = "parameter", bt.name = "fc.weight"}, %arg1: !torch.vtensor<[?,?,8],f32> {bt.kind = "input", bt.name = "x"}
// CHECK-SAME:    -> (!torch.vtensor<[?,?,4],f32> {bt.kind = "output", bt.name = "output.0"},
// CHECK-SAME:    attributes {bt.program = "main", bt.stage = "dynamic"}
// CHECK:      %[[X2:[0-9]+]] = torch.aten.flatten.using_ints %arg1, %int0, %int1 : !torch.vtensor<[?,?,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[?,8],f32>
// CHECK-NEXT: %[[Y2:[0-9]+]] = torch.aten.mm %[[X2]], %arg0 : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
// CHECK-NEXT: %[[C0:[a-z0-9_]+]] = torch.constant.int 0
// CHECK-NEXT: %[[D0:[0-9]+]] = torch.aten.size.int %arg1, %[[C0]] : !torch.vtensor<[?,?,8],f32>, !torch.int -> !torch.int
// CHECK-NEXT: %[[C1:[a-z0-9_]+]] = torch.constant.int 1
// CHECK-NEXT: %[[D1:[0-9]+]] = torch.aten.size.int %arg1, %[[C1]] : !torch.vtensor<[?,?,8],f32>, !torch.int -> !torch.int
// CHECK-NEXT: %[[N:[a-z0-9_]+]] = torch.constant.int 4
// CHECK-NEXT: %[[SIZES:[0-9]+]] = torch.prim.ListConstruct %[[D0]], %[[D1]], %[[N]] : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
// CHECK-NEXT: %[[Y:[0-9]+]] = torch.aten.view %[[Y2]], %[[SIZES]] : !torch.vtensor<[?,4],f32>, !torch.list<int> -> !torch.vtensor<[?,?,4],f32>
// Static leading dims: [2,3] flatten to 6 rows; the view sizes are constants.
// CHECK:      %[[S2:[0-9]+]] = torch.aten.flatten.using_ints %arg2, %{{.+}}, %{{.+}} : !torch.vtensor<[2,3,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[6,8],f32>
// CHECK-NEXT: %[[T2:[0-9]+]] = torch.aten.mm %[[S2]], %arg0 : !torch.vtensor<[6,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[6,4],f32>
// CHECK-NEXT: %[[B0:[a-z0-9_]+]] = torch.constant.int 2
// CHECK-NEXT: %[[B1:[a-z0-9_]+]] = torch.constant.int 3
// CHECK-NEXT: %[[B2:[a-z0-9_]+]] = torch.constant.int 4
// CHECK-NEXT: %[[SIZES2:[0-9]+]] = torch.prim.ListConstruct %[[B0]], %[[B1]], %[[B2]] :
// CHECK-NEXT: %[[T:[0-9]+]] = torch.aten.view %[[T2]], %[[SIZES2]] : !torch.vtensor<[6,4],f32>, !torch.list<int> -> !torch.vtensor<[2,3,4],f32>
// The 2-D product stays a matmul.
// CHECK-NEXT: %[[U:[0-9]+]] = torch.aten.matmul %arg3, %arg0 : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
// CHECK-NEXT: return %[[Y]], %[[T]], %[[U]] :
func.func @forward(%arg0: !torch.vtensor<[8,4],f32> {bt.kind = "parameter", bt.name = "fc.weight"}, %arg1: !torch.vtensor<[?,?,8],f32> {bt.kind = "input", bt.name = "x"}, %arg2: !torch.vtensor<[2,3,8],f32> {bt.kind = "input", bt.name = "y"}, %arg3: !torch.vtensor<[?,8],f32> {bt.kind = "input", bt.name = "z"}) -> (!torch.vtensor<[?,?,4],f32> {bt.kind = "output", bt.name = "output.0"}, !torch.vtensor<[2,3,4],f32> {bt.kind = "output", bt.name = "output.1"}, !torch.vtensor<[?,4],f32> {bt.kind = "output", bt.name = "output.2"}) attributes {bt.program = "main", bt.stage = "dynamic"} {
  %0 = torch.aten.matmul %arg1, %arg0 : !torch.vtensor<[?,?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,?,4],f32>
  %1 = torch.aten.matmul %arg2, %arg0 : !torch.vtensor<[2,3,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[2,3,4],f32>
  %2 = torch.aten.matmul %arg3, %arg0 : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
  return %0, %1, %2 : !torch.vtensor<[?,?,4],f32>, !torch.vtensor<[2,3,4],f32>, !torch.vtensor<[?,4],f32>
}
