// RUN: stageml-opt %s -p bt-split | filecheck %s

// A routed gather (bt-stacks' output): the ids are computed in the request
// stage (the router's arg-max), so the stack is indexed where the product
// first uses it, after the routing. The stack is a model parameter used as it
// is (already [E, in, out]), so @forward takes it by its own name and there
// is no @static.

// CHECK:       module {
// CHECK-NOT:     func.func @static
// CHECK-LABEL: func.func @forward
// CHECK-SAME:    (%arg0: !torch.vtensor<[16,4],f32> {bt.kind = "parameter", bt.name = "router.weight"},
// CHECK-SAME:     %arg1: !torch.vtensor<[4,16,8],f32> {bt.kind = "parameter", bt.name = "experts.weight"},
// CHECK-SAME:     %arg2: !torch.vtensor<[?,16],f32> {bt.kind = "input", bt.name = "x"})
// CHECK:         %[[S:[0-9]+]] = torch.aten.matmul %arg2, %arg0
// CHECK:         %{{.*}}, %[[IDX:.*]] = torch.aten.max.dim %[[S]]
// CHECK:         %[[E:[0-9]+]] = torch.aten.index_select %arg1, %{{.*}}, %[[IDX]] : !torch.vtensor<[4,16,8],f32>, !torch.int, !torch.vtensor<[?],si64> -> !torch.vtensor<[?,16,8],f32>
// CHECK:         torch.aten.matmul %{{[0-9]+}}, %[[E]]
// CHECK-NOT:     bt.gather
module {
  func.func @main(%arg0: !torch.vtensor<[4,16,8],f32> {bt.name = "experts.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[16,4],f32> {bt.name = "router.weight", bt.time = #bt.time<"static">}, %arg2: !torch.vtensor<[?,16],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,1,8],f32> attributes {bt.program = "main"} {
    %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %int-1 = torch.constant.int -1 {bt.time = #bt.time<"static">}
    %false = torch.constant.bool false {bt.time = #bt.time<"static">}
    %0 = "bt.lift"(%arg1) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "router.weight", to = #bt.time<"dynamic">} : (!torch.vtensor<[16,4],f32>) -> !torch.vtensor<[16,4],f32>
    %1 = torch.aten.matmul %arg2, %0 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,16],f32>, !torch.vtensor<[16,4],f32> -> !torch.vtensor<[?,4],f32>
    %values, %indices = torch.aten.max.dim %1, %int-1, %false {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,4],f32>, !torch.int, !torch.bool -> !torch.vtensor<[?],f32>, !torch.vtensor<[?],si64>
    %2 = "bt.gather"(%arg0, %indices) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "experts.weight", stack = "leading", to = #bt.time<"dynamic">} : (!torch.vtensor<[4,16,8],f32>, !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,16,8],f32>
    %3 = torch.aten.unsqueeze %arg2, %int1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,16],f32>, !torch.int -> !torch.vtensor<[?,1,16],f32>
    %4 = torch.aten.matmul %3, %2 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,16],f32>, !torch.vtensor<[?,16,8],f32> -> !torch.vtensor<[?,1,8],f32>
    return %4 : !torch.vtensor<[?,1,8],f32>
  }
}
