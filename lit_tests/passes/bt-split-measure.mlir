// RUN: stageml-opt %s -p bt-split | filecheck %s

// A bt.measure of an adapter-time value (requantize-merged's: a re-quantized
// merge's squared error and update) becomes a result of @adapter of kind
// "measure", with its name and sites, after the state @forward takes; no later
// stage takes it, and @forward's state argument keeps its result index.

// CHECK-LABEL: func.func @adapter
// CHECK-SAME:    -> (!torch.vtensor<[8,4],f32> {bt.kind = "state", bt.name = "adapter.0"}, !torch.vtensor<[2],f32> {bt.kind = "measure", bt.name = "quantization_error.0", bt.sites = ["fc.lora_A.default.weight"]})
// CHECK-SAME:    attributes {bt.program = "main", bt.stage = "adapter"}
// CHECK:         return %{{[0-9]+}}, %{{[0-9]+}} : !torch.vtensor<[8,4],f32>, !torch.vtensor<[2],f32>
// CHECK-LABEL: func.func @forward
// CHECK-SAME:    (%arg0: !torch.vtensor<[8,4],f32> {bt.kind = "state", bt.name = "adapter.0", bt.result = 0 : i64}, %arg1: !torch.vtensor<[?,8],f32> {bt.kind = "input", bt.name = "x"})
// CHECK-NOT:     bt.measure
func.func @main(%arg0: !torch.vtensor<[8,4],f32> {bt.name = "fc.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[8,4],f32> {bt.name = "fc.delta", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[?,8],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,4],f32> attributes {bt.program = "main"} {
  %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
  %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
  %none = torch.constant.none {bt.time = #bt.time<"static">}
  %0 = "bt.lift"(%arg0) {bt.time = #bt.time<"adapter">, from = #bt.time<"static">, name = "fc.weight", to = #bt.time<"adapter">} : (!torch.vtensor<[8,4],f32>) -> !torch.vtensor<[8,4],f32>
  %1 = torch.aten.add.Tensor %0, %arg1, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,4],f32>, !torch.vtensor<[8,4],f32>, !torch.int -> !torch.vtensor<[8,4],f32>
  %2 = "bt.lift"(%1) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "adapter.0", to = #bt.time<"dynamic">} : (!torch.vtensor<[8,4],f32>) -> !torch.vtensor<[8,4],f32>
  %3 = torch.aten.matmul %arg2, %2 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
  %4 = torch.aten.mul.Tensor %arg1, %arg1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,4],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[8,4],f32>
  %5 = torch.aten.sum %4, %none {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %6 = torch.aten.unsqueeze %5, %int0 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[],f32>, !torch.int -> !torch.vtensor<[1],f32>
  %7 = torch.prim.ListConstruct %6, %6 {bt.time = #bt.time<"adapter">} : (!torch.vtensor<[1],f32>, !torch.vtensor<[1],f32>) -> !torch.list<vtensor>
  %8 = torch.aten.cat %7, %int0 {bt.time = #bt.time<"adapter">} : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[2],f32>
  "bt.measure"(%8) {bt.time = #bt.time<"adapter">, name = "quantization_error.0", sites = ["fc.lora_A.default.weight"]} : (!torch.vtensor<[2],f32>) -> ()
  return %3 : !torch.vtensor<[?,4],f32>
}
