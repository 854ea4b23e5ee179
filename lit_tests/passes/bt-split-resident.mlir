// RUN: stageml-opt %s -p bt-split | filecheck %s
// RUN: sed -e 's/^module attributes {bt.tenants = {.*}} {$/module {/' %s | not stageml-opt - -p bt-split 2>&1 | filecheck %s --check-prefix=TENANTS

// Resident state, on bt-gather's output: the "factorized" program's stage
// functions are @static_factorized, @adapter_factorized and
// @forward_factorized. A value bt.gather indexes by slots (stack = "slots")
// is resident: an @adapter result and a @forward argument of kind
// "resident", with one entry per slot (max_adapters + 1 of them: slot 0 is
// the base model) declared on the module in bt.resident, its owning stage
// and program, shape with the slot dimension leading, and element type.
// @forward indexes each table by the rows' adapter_ids.

// CHECK:       module attributes {bt.resident = [
// CHECK-SAME:    {dtype = "float32", name = "factorized.adapter.0", owner = "adapter", program = "factorized", shape = [5, 64, 16], slot_dim = 0 : i64},
// CHECK-SAME:    {dtype = "float32", name = "factorized.adapter.1", owner = "adapter", program = "factorized", shape = [5, 16, 48], slot_dim = 0 : i64}],
// CHECK-SAME:    bt.tenants = {max_adapters = 4 : i64, max_rank = 16 : i64}}

// CHECK-LABEL: func.func @static_factorized
// CHECK-SAME:    (%arg0: !torch.vtensor<[48,64],f32> {bt.kind = "parameter", bt.name = "fc.base_layer.weight"})
// CHECK-SAME:    -> (!torch.vtensor<[64,48],f32> {bt.kind = "parameter", bt.name = "factorized.static.0"})
// CHECK-SAME:    attributes {bt.program = "factorized", bt.stage = "static"}

// CHECK-LABEL: func.func @adapter_factorized
// CHECK-SAME:    (%arg0: !torch.vtensor<[16,64],f32> {bt.kind = "input", bt.name = "fc.lora_A.default.weight"},
// CHECK-SAME:     %arg1: !torch.vtensor<[48,16],f32> {bt.kind = "input", bt.name = "fc.lora_B.default.weight"})
// CHECK-SAME:    -> (!torch.vtensor<[64,16],f32> {bt.kind = "resident", bt.name = "factorized.adapter.0"}, !torch.vtensor<[16,48],f32> {bt.kind = "resident", bt.name = "factorized.adapter.1"})
// CHECK-SAME:    attributes {bt.program = "factorized", bt.stage = "adapter"}
// CHECK:         %[[AT:[0-9]+]] = torch.aten.transpose.int %arg0
// CHECK-NEXT:    %[[BT:[0-9]+]] = torch.aten.transpose.int %arg1
// CHECK-NEXT:    return %[[AT]], %[[BT]]

// CHECK-LABEL: func.func @forward_factorized
// CHECK-SAME:    (%arg0: !torch.vtensor<[64,48],f32> {bt.kind = "parameter", bt.name = "factorized.static.0"},
// CHECK-SAME:     %arg1: !torch.vtensor<[?,64,16],f32> {bt.kind = "resident", bt.name = "factorized.adapter.0"},
// CHECK-SAME:     %arg2: !torch.vtensor<[?,16,48],f32> {bt.kind = "resident", bt.name = "factorized.adapter.1"},
// CHECK-SAME:     %arg3: !torch.vtensor<[?,64],f32> {bt.kind = "input", bt.name = "x"},
// CHECK-SAME:     %arg4: !torch.vtensor<[?],si64> {bt.kind = "input", bt.name = "adapter_ids"})
// CHECK-SAME:    -> (!torch.vtensor<[?,48],f32> {bt.kind = "output", bt.name = "output.0"})
// CHECK-SAME:    attributes {bt.program = "factorized", bt.stage = "dynamic"}
// CHECK:         %[[RA:[0-9]+]] = torch.aten.index_select %arg1, %{{.*}}, %arg4 : !torch.vtensor<[?,64,16],f32>, !torch.int, !torch.vtensor<[?],si64> -> !torch.vtensor<[?,64,16],f32>
// CHECK:         torch.aten.matmul %{{[0-9]+}}, %[[RA]] :
// CHECK:         %[[RB:[0-9]+]] = torch.aten.index_select %arg2, %{{.*}}, %arg4 : !torch.vtensor<[?,16,48],f32>, !torch.int, !torch.vtensor<[?],si64> -> !torch.vtensor<[?,16,48],f32>
// CHECK:         torch.aten.matmul %{{[0-9]+}}, %[[RB]] :
// CHECK-NOT:     bt.gather
// CHECK-NOT:     bt.time

// Slot tables need the multi-tenant configuration.
// TENANTS: stageml-opt: error: bt.gather 'factorized.adapter.0' indexes adapter slots, but the module declares no bt.tenants: run lora-sites (a multi-tenant compile) first
module attributes {bt.tenants = {max_adapters = 4 : i64, max_rank = 16 : i64}} {
  func.func @main_factorized(%arg0: !torch.vtensor<[48,64],f32> {bt.name = "fc.base_layer.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[16,64],f32> {bt.name = "fc.lora_A.default.weight", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[48,16],f32> {bt.name = "fc.lora_B.default.weight", bt.time = #bt.time<"adapter">}, %arg3: !torch.vtensor<[?,64],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}, %arg4: !torch.vtensor<[?],si64> {bt.name = "adapter_ids", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,48],f32> attributes {bt.program = "factorized"} {
    %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %0 = torch.aten.transpose.int %arg0, %int0, %int1 {bt.time = #bt.time<"static">} : !torch.vtensor<[48,64],f32>, !torch.int, !torch.int -> !torch.vtensor<[64,48],f32>
    %int0_0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %int1_1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %1 = torch.aten.transpose.int %arg1, %int0_0, %int1_1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[16,64],f32>, !torch.int, !torch.int -> !torch.vtensor<[64,16],f32>
    %2 = torch.aten.transpose.int %arg2, %int0_0, %int1_1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[48,16],f32>, !torch.int, !torch.int -> !torch.vtensor<[16,48],f32>
    %3 = "bt.lift"(%0) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "factorized.static.0", to = #bt.time<"dynamic">} : (!torch.vtensor<[64,48],f32>) -> !torch.vtensor<[64,48],f32>
    %4 = torch.aten.matmul %arg3, %3 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,48],f32> -> !torch.vtensor<[?,48],f32>
    %5 = "bt.gather"(%1, %arg4) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "factorized.adapter.0", stack = "slots", to = #bt.time<"dynamic">} : (!torch.vtensor<[64,16],f32>, !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,64,16],f32>
    %int1_2 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %6 = torch.aten.unsqueeze %arg3, %int1_2 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,64],f32>, !torch.int -> !torch.vtensor<[?,1,64],f32>
    %7 = torch.aten.matmul %6, %5 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,64],f32>, !torch.vtensor<[?,64,16],f32> -> !torch.vtensor<[?,1,16],f32>
    %int1_3 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %8 = torch.aten.squeeze.dim %7, %int1_3 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,16],f32>, !torch.int -> !torch.vtensor<[?,16],f32>
    %9 = "bt.gather"(%2, %arg4) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "factorized.adapter.1", stack = "slots", to = #bt.time<"dynamic">} : (!torch.vtensor<[16,48],f32>, !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,16,48],f32>
    %int1_4 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %10 = torch.aten.unsqueeze %8, %int1_4 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,16],f32>, !torch.int -> !torch.vtensor<[?,1,16],f32>
    %11 = torch.aten.matmul %10, %9 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,16],f32>, !torch.vtensor<[?,16,48],f32> -> !torch.vtensor<[?,1,48],f32>
    %int1_5 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %12 = torch.aten.squeeze.dim %11, %int1_5 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,48],f32>, !torch.int -> !torch.vtensor<[?,48],f32>
    %13 = torch.aten.add.Tensor %4, %12, %int1_1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,48],f32>, !torch.vtensor<[?,48],f32>, !torch.int -> !torch.vtensor<[?,48],f32>
    return %13 : !torch.vtensor<[?,48],f32>
  }
}
