// RUN: stageml-opt %s -p bt-split | filecheck %s

// A buffer the model mutates (the frontend's bt.mutated on its argument and
// bt.kind = "buffer" on the result holding its new value) is request-time
// state: @forward takes it as an argument of kind "buffer" and returns its
// new value as a result of kind "buffer" of the same name (resident-state
// then keeps it on the device).

// CHECK-LABEL: func.func @forward
// CHECK-SAME:    %arg1: !torch.vtensor<[?,4],f32> {bt.kind = "input", bt.name = "x"}
// CHECK-SAME:    %arg2: !torch.vtensor<[4],f32> {bt.kind = "buffer", bt.name = "total"}
// CHECK-SAME:    -> (!torch.vtensor<[4],f32> {bt.kind = "buffer", bt.name = "total"}, !torch.vtensor<[?,4],f32> {bt.kind = "output", bt.name = "output.0"})
// CHECK-SAME:    attributes {bt.program = "main", bt.stage = "dynamic"}
func.func @main(%arg0: !torch.vtensor<[4,4],f32> {bt.name = "fc.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[?,4],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}, %arg2: !torch.vtensor<[4],f32> {bt.mutated = true, bt.name = "total", bt.time = #bt.time<"dynamic">}) -> (!torch.vtensor<[4],f32> {bt.kind = "buffer", bt.name = "total"}, !torch.vtensor<[?,4],f32> {bt.name = "output.0"}) attributes {bt.program = "main"} {
  %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
  %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
  %none = torch.constant.none {bt.time = #bt.time<"static">}
  %false = torch.constant.bool false {bt.time = #bt.time<"static">}
  %0 = "bt.lift"(%arg0) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "fc.weight", to = #bt.time<"dynamic">} : (!torch.vtensor<[4,4],f32>) -> !torch.vtensor<[4,4],f32>
  %1 = torch.aten.matmul %arg1, %0 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[?,4],f32>
  %2 = torch.prim.ListConstruct %int0 {bt.time = #bt.time<"static">} : (!torch.int) -> !torch.list<int>
  %3 = torch.aten.sum.dim_IntList %arg1, %2, %false, %none {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,4],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[4],f32>
  %4 = torch.aten.add.Tensor %arg2, %3, %int1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.int -> !torch.vtensor<[4],f32>
  return %4, %1 : !torch.vtensor<[4],f32>, !torch.vtensor<[?,4],f32>
}
