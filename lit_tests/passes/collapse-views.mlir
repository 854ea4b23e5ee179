// RUN: stageml-opt %s -p collapse-views | filecheck %s

// A view of an input with two or more dynamic dims that only merges runs of
// consecutive dims becomes flattens (torch-mlir lowers such a view as if all
// but one dynamic dim were 1: llvm/torch-mlir#3852). Sizes name the dims
// they merge by aten.size.int and aten.mul.int, by constants, or by one -1.
// In the compiler it runs after bt-split, on every stage function: here
// bt-split's @forward, whose facts stay as they are.

// CHECK-LABEL: func.func @forward
// CHECK-SAME:    attributes {bt.program = "main", bt.stage = "dynamic"}
// [?,?,64] -> [size0 * size1, 64]
// CHECK:      %[[A:[0-9]+]] = torch.aten.flatten.using_ints %arg0, %int0{{.*}}, %int1{{.*}} : !torch.vtensor<[?,?,64],f32>, !torch.int, !torch.int -> !torch.vtensor<[?,64],f32>
// [?,?,64] -> [-1, 64]
// CHECK:      %[[B:[0-9]+]] = torch.aten.flatten.using_ints %arg0, %int0{{.*}}, %int1{{.*}} : !torch.vtensor<[?,?,64],f32>, !torch.int, !torch.int -> !torch.vtensor<[?,64],f32>
// [?,?,4,16] -> [size0 * size1, 64]: the static run first, then the dynamic one
// CHECK:      %[[C1:[0-9]+]] = torch.aten.flatten.using_ints %arg1, %int2{{.*}}, %int3{{.*}} : !torch.vtensor<[?,?,4,16],f32>, !torch.int, !torch.int -> !torch.vtensor<[?,?,64],f32>
// CHECK:      %[[C:[0-9]+]] = torch.aten.flatten.using_ints %[[C1]], %int0{{.*}}, %int1{{.*}} : !torch.vtensor<[?,?,64],f32>, !torch.int, !torch.int -> !torch.vtensor<[?,64],f32>
// [?,?,64] -> [size0, size1 * 64]
// CHECK:      %[[D:[0-9]+]] = torch.aten.flatten.using_ints %arg0, %int1{{.*}}, %int2{{.*}} : !torch.vtensor<[?,?,64],f32>, !torch.int, !torch.int -> !torch.vtensor<[?,?],f32>
// A view that splits a dim, and one of an input with a single dynamic dim, stay views.
// CHECK:      %[[E:[0-9]+]] = torch.aten.view %arg0, %{{.+}} : !torch.vtensor<[?,?,64],f32>, !torch.list<int> -> !torch.vtensor<[?,?,4,16],f32>
// CHECK:      %[[F:[0-9]+]] = torch.aten.view %arg2, %{{.+}} : !torch.vtensor<[?,8,64],f32>, !torch.list<int> -> !torch.vtensor<[?,512],f32>
// [?,?,64] (a value computed from %arg0) -> [size(%arg0, 0) * size(%arg0, 1), 64]: the sizes of
// another tensor, which the view's element count fixes to the dims the 64 leaves
// CHECK:      %[[R:[0-9]+]] = torch.aten.relu %arg0
// CHECK:      %[[G:[0-9]+]] = torch.aten.flatten.using_ints %[[R]], %int0{{.*}}, %int1{{.*}} : !torch.vtensor<[?,?,64],f32>, !torch.int, !torch.int -> !torch.vtensor<[?,64],f32>
// CHECK:      return %[[A]], %[[B]], %[[C]], %[[D]], %[[E]], %[[F]], %[[G]] :
func.func @forward(%arg0: !torch.vtensor<[?,?,64],f32> {bt.kind = "input", bt.name = "x"}, %arg1: !torch.vtensor<[?,?,4,16],f32> {bt.kind = "input", bt.name = "y"}, %arg2: !torch.vtensor<[?,8,64],f32> {bt.kind = "input", bt.name = "z"}) -> (!torch.vtensor<[?,64],f32> {bt.kind = "output", bt.name = "output.0"}, !torch.vtensor<[?,64],f32> {bt.kind = "output", bt.name = "output.1"}, !torch.vtensor<[?,64],f32> {bt.kind = "output", bt.name = "output.2"}, !torch.vtensor<[?,?],f32> {bt.kind = "output", bt.name = "output.3"}, !torch.vtensor<[?,?,4,16],f32> {bt.kind = "output", bt.name = "output.4"}, !torch.vtensor<[?,512],f32> {bt.kind = "output", bt.name = "output.5"}, !torch.vtensor<[?,64],f32> {bt.kind = "output", bt.name = "output.6"}) attributes {bt.program = "main", bt.stage = "dynamic"} {
  %int-1 = torch.constant.int -1
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int4 = torch.constant.int 4
  %int16 = torch.constant.int 16
  %int64 = torch.constant.int 64
  %int512 = torch.constant.int 512
  %0 = torch.aten.size.int %arg0, %int0 : !torch.vtensor<[?,?,64],f32>, !torch.int -> !torch.int
  %1 = torch.aten.size.int %arg0, %int1 : !torch.vtensor<[?,?,64],f32>, !torch.int -> !torch.int
  %2 = torch.aten.mul.int %0, %1 : !torch.int, !torch.int -> !torch.int
  %3 = torch.prim.ListConstruct %2, %int64 : (!torch.int, !torch.int) -> !torch.list<int>
  %4 = torch.aten.view %arg0, %3 : !torch.vtensor<[?,?,64],f32>, !torch.list<int> -> !torch.vtensor<[?,64],f32>
  %5 = torch.prim.ListConstruct %int-1, %int64 : (!torch.int, !torch.int) -> !torch.list<int>
  %6 = torch.aten.view %arg0, %5 : !torch.vtensor<[?,?,64],f32>, !torch.list<int> -> !torch.vtensor<[?,64],f32>
  %7 = torch.aten.size.int %arg1, %int0 : !torch.vtensor<[?,?,4,16],f32>, !torch.int -> !torch.int
  %8 = torch.aten.size.int %arg1, %int1 : !torch.vtensor<[?,?,4,16],f32>, !torch.int -> !torch.int
  %9 = torch.aten.mul.int %7, %8 : !torch.int, !torch.int -> !torch.int
  %10 = torch.prim.ListConstruct %9, %int64 : (!torch.int, !torch.int) -> !torch.list<int>
  %11 = torch.aten.view %arg1, %10 : !torch.vtensor<[?,?,4,16],f32>, !torch.list<int> -> !torch.vtensor<[?,64],f32>
  %12 = torch.aten.mul.int %1, %int64 : !torch.int, !torch.int -> !torch.int
  %13 = torch.prim.ListConstruct %0, %12 : (!torch.int, !torch.int) -> !torch.list<int>
  %14 = torch.aten.view %arg0, %13 : !torch.vtensor<[?,?,64],f32>, !torch.list<int> -> !torch.vtensor<[?,?],f32>
  %15 = torch.prim.ListConstruct %0, %1, %int4, %int16 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %16 = torch.aten.view %arg0, %15 : !torch.vtensor<[?,?,64],f32>, !torch.list<int> -> !torch.vtensor<[?,?,4,16],f32>
  %17 = torch.aten.size.int %arg2, %int0 : !torch.vtensor<[?,8,64],f32>, !torch.int -> !torch.int
  %18 = torch.prim.ListConstruct %17, %int512 : (!torch.int, !torch.int) -> !torch.list<int>
  %19 = torch.aten.view %arg2, %18 : !torch.vtensor<[?,8,64],f32>, !torch.list<int> -> !torch.vtensor<[?,512],f32>
  %20 = torch.aten.relu %arg0 : !torch.vtensor<[?,?,64],f32> -> !torch.vtensor<[?,?,64],f32>
  %21 = torch.aten.view %20, %3 : !torch.vtensor<[?,?,64],f32>, !torch.list<int> -> !torch.vtensor<[?,64],f32>
  return %4, %6, %11, %14, %16, %19, %21 : !torch.vtensor<[?,64],f32>, !torch.vtensor<[?,64],f32>, !torch.vtensor<[?,64],f32>, !torch.vtensor<[?,?],f32>, !torch.vtensor<[?,?,4,16],f32>, !torch.vtensor<[?,512],f32>, !torch.vtensor<[?,64],f32>
}
