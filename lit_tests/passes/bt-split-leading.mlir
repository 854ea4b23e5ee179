// RUN: stageml-opt %s -p bt-split | filecheck %s

// A bt.gather of a value's own leading dimension (stack = "leading": an
// expert stack indexed by routed expert ids) is the same lowering as a slot
// table's, without resident state: the later stage takes the stack whole, as
// a parameter (here) or adapter state, and indexes it by the ids.

// CHECK:       module {
// CHECK-NOT:     bt.resident
// CHECK-LABEL: func.func @static
// CHECK-SAME:    -> (!torch.vtensor<[4,16,8],f32> {bt.kind = "parameter", bt.name = "static.0"})
// CHECK-LABEL: func.func @forward
// CHECK-SAME:    (%arg0: !torch.vtensor<[4,16,8],f32> {bt.kind = "parameter", bt.name = "static.0"},
// CHECK-SAME:     %arg1: !torch.vtensor<[?,1,16],f32> {bt.kind = "input", bt.name = "x"},
// CHECK-SAME:     %arg2: !torch.vtensor<[?],si64> {bt.kind = "input", bt.name = "expert_ids"})
// CHECK:         %[[E:[0-9]+]] = torch.aten.index_select %arg0, %{{.*}}, %arg2 : !torch.vtensor<[4,16,8],f32>, !torch.int, !torch.vtensor<[?],si64> -> !torch.vtensor<[?,16,8],f32>
// CHECK:         torch.aten.matmul %arg1, %[[E]]
// CHECK-NOT:     bt.gather
module {
  func.func @main(%arg0: !torch.vtensor<[4,8,16],f32> {bt.name = "experts.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[?,1,16],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}, %arg2: !torch.vtensor<[?],si64> {bt.name = "expert_ids", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,1,8],f32> attributes {bt.program = "main"} {
    %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %int2 = torch.constant.int 2 {bt.time = #bt.time<"static">}
    %0 = torch.aten.transpose.int %arg0, %int1, %int2 {bt.time = #bt.time<"static">} : !torch.vtensor<[4,8,16],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,16,8],f32>
    %1 = "bt.gather"(%0, %arg2) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "static.0", stack = "leading", to = #bt.time<"dynamic">} : (!torch.vtensor<[4,16,8],f32>, !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,16,8],f32>
    %2 = torch.aten.matmul %arg1, %1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,16],f32>, !torch.vtensor<[?,16,8],f32> -> !torch.vtensor<[?,1,8],f32>
    return %2 : !torch.vtensor<[?,1,8],f32>
  }
}
